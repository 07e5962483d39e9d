"""Which steps of an AutoOrder section may swap places, and the section's order under those rules.

AutoOrder sorts a section (a run of movable steps between barriers) by inflation class. Two
rules restrict which pairs of steps that sort may swap:

- **Shape.** Two steps may swap only when at least one of them kept its input's dtype and shape
  on every profiled sample (``StepStats.keeps_shape``; a step not measured counts as changing).
  Such a step commutes with another *in signature*: a flip before or after a resize gives an
  output of the resize's shape either way. Two steps that both change the dtype or the shape
  generally do not: a scale jitter then a fixed-size crop gives the crop's size, the crop then
  the jitter twice it or more (a bug hunt saw the second epoch's collate fail on 32x32 and 64x64
  samples); a crop and a resize likewise. (A step that changes the dtype never gets here: it is
  a barrier, ``sizes.type_signature``.) So the steps that change
  the shape keep their declared relative order and the others move across them.
- **Names.** Steps that share a name never swap: headrace tells them apart by their place
  among the steps of that name (the profile entry each is matched to, its per-sample random
  stream, the step order a state dict records), so a section whose order would swap two of them
  keeps its declared order, with a note (give them distinct names to let AutoOrder move them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headrace.pipeline.step import Step

__all__ = ["order_section", "swaps_a_name"]


def order_section(
    steps: Sequence[Step], run: Sequence[int], rank: Sequence[int], keeps_shape: Sequence[bool]
) -> tuple[list[int], list[str]]:
    """The order of one section and notes on the swaps the shape rule prevented.

    ``run``: the section's declared positions, ascending; ``rank[j]``: step ``j``'s class
    (0 deflationary, 1 neutral or unknown, 2 inflationary); ``keeps_shape[j]``: step ``j`` kept
    dtype and shape on every profiled sample. Steps are taken in order of (rank, declared
    position), a step that changes the shape only once every earlier such step of the section
    is placed: without shape-changing pairs, that is the stable sort by rank.
    """
    left = list(run)
    chosen: list[int] = []
    while left:
        first_changing = next((j for j in left if not keeps_shape[j]), None)
        pick = min((j for j in left if keeps_shape[j] or j == first_changing),
                   key=lambda j: (rank[j], j))
        chosen.append(pick)
        left.remove(pick)
    free = sorted(run, key=lambda j: rank[j])
    at = {j: k for k, j in enumerate(free)}
    notes = []
    changing = [j for j in run if not keeps_shape[j]]
    for b in changing:
        held = [a for a in changing if a < b and at[a] > at[b]]
        if held:
            notes.append(
                f"{steps[b].name} stays after {', '.join(steps[a].name for a in held)}: "
                f"{'each' if len(held) > 1 else 'both'} changed the sample's dtype or shape on "
                "some profiled sample (or were not measured), and two such steps do not commute "
                "(the output's shape could change)")
    return chosen, notes


def swaps_a_name(steps: Sequence[Step], chosen: Sequence[int]) -> str | None:
    """Why the order ``chosen`` (declared positions) may not run: it puts a step before an
    earlier declared step of the same name. None when it keeps every name's steps in order."""
    last: dict[str, int] = {}
    for j in chosen:
        name = steps[j].name
        if last.get(name, -1) > j:
            return (f"{name} (steps {j + 1} and {last[name] + 1} of the declared order) would "
                    "swap places: steps that share a name are told apart by their place among "
                    "the steps of that name (their profiles, their random streams, a state "
                    "dict's step order), so their section keeps its declared order; give them "
                    "distinct names (step(fn, name=...)) to let AutoOrder move them")
        last[name] = max(j, last.get(name, -1))
    return None
