"""AutoOrder (Pecan §5.2, Algorithm 2): reorder steps by inflation factor, within barriers.

A step's inflation factor is its output bytes over its input bytes per sample (from the
profile: ``StepStats.inflation``). Moving deflationary steps (factor < 1) upstream and
inflationary ones (factor > 1) downstream makes the other steps work on smaller samples.

Rules, as in Pecan with headrace's traits:

- Barriers split the pipeline into sections and never move, nor does anything cross them:
  ``keep_position`` steps, ``kind="decode"`` steps, and steps the profiler saw change the
  sample's type, rank or dtype (``changes_type``; Pecan moves casts, headrace does not: a step
  that kept its dtype after a cast may not keep it before one). Steps that are neither ``random`` nor ``commutes``
  (``Step.movable`` is false) are fixed too: reordering them is not known to be safe, so they
  bound sections like barriers (declare ``commutes=True`` to let AutoOrder move them).
- Within a section, steps are stably partitioned: deflationary first, then neutral, then
  inflationary; factors within the neutral band [0.95, 1.05] count as 1, as do unknown ones.
- Two steps swap only when one of them kept its input's dtype and shape on every profiled
  sample (``keeps_shape``; unknown counts as changing): the steps that change the shape keep
  their declared relative order, the others move across them (``planner/commute.py``).
- Steps that share a name never swap places: a section whose order would swap two of them
  keeps its declared order, and a note says so (``planner/commute.py``). Other steps may still
  move across them.
- Deviation from Algorithm 2: Pecan *prepends* each deflationary step to the prefix, which
  reverses the relative order of several deflationary steps; headrace keeps every class in its
  declared order (stable), so two crops, say, are never swapped for no measured gain. Pecan's
  exception for casts to bfloat16 (moved last) is not modelled.

Cost model for the CPU estimate: a step's CPU time is proportional to its input bytes,
``cpu_i * b / bytes_in_i``, where ``cpu_i`` and ``bytes_in_i`` are measured and ``b`` is the
input size the step gets in the order considered: the pipeline's input size times the factors
of the steps before it. Steps with a fixed cost (I/O, per-call overhead) make the estimate of
the gain optimistic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from headrace import units
from headrace.pipeline.pipeline import LOAD_STEP
from headrace.planner.commute import order_section, swaps_a_name
from headrace.planner.order_cost import expected_cpu

if TYPE_CHECKING:
    from headrace.pipeline.step import Step
    from headrace.profiler.report import PipelineProfile, StepStats

__all__ = [
    "NEUTRAL_BAND",
    "AutoOrderDecision",
    "StepMove",
    "autoorder",
    "autoorder_from_profile",
    "classify",
    "expected_cpu",
]

NEUTRAL_BAND = (0.95, 1.05)
"""Inflation factors within this closed interval count as 1 (the step is neither moved up nor down)."""

CPU_UP = (", up: the moves follow the inflation factors alone (Pecan Alg. 2); the steps they "
          "cross read smaller samples, but the moved steps read larger ones (a step they crossed, "
          "within the neutral band, changes sizes), which by this model costs more than it saves")
"""What ``explain()`` adds where the order it reports raises the model's CPU estimate."""
Role = Literal["deflationary", "neutral", "inflationary", "unknown", "barrier", "fixed"]
_RANK = {"deflationary": 0, "neutral": 1, "unknown": 1, "inflationary": 2}


@dataclasses.dataclass(frozen=True)
class StepMove:
    """One step that AutoOrder moved, and why.

    ``index`` is its position in the declared order; ``crossed`` are the steps it now runs
    before (a deflationary step) or after (an inflationary one); ``inflation`` is its factor
    (output bytes / input bytes).
    """

    step: str
    index: int
    role: Literal["deflationary", "inflationary"]
    inflation: float
    crossed: tuple[str, ...]
    reason: str


@dataclasses.dataclass(frozen=True)
class AutoOrderDecision:
    """The step order AutoOrder chose, with the numbers behind it.

    Attributes:
        original: the steps in the order given.
        steps: the steps in the chosen order (``pipeline.with_steps(decision.steps)``).
        order: ``steps[i] is original[order[i]]``.
        roles: per original step, its role (``"barrier"``, ``"fixed"``, ``"deflationary"``,
            ``"neutral"``, ``"inflationary"``, ``"unknown"``).
        factors: per original step, its measured inflation factor (``None``: unknown).
        sections: original positions of each reorderable section (runs of movable steps).
        moves: the steps actively moved (a neutral step shifted by them is not listed).
        notes: other observations worth reading (hints, data-dependent factors).
        held: why sections kept their declared order although AutoOrder had another one for
            them (the new order would have swapped steps that share a name); also in ``notes``.
        apart: steps kept in their declared relative order because both change the sample's
            dtype or shape (``planner/commute.py``), one line per step held; also in ``notes``.
        keeps_shape: per original step, whether it kept dtype and shape on every profiled
            sample (what the chosen order relies on where such a step moved across another;
            checked per sample as it runs, ``pipeline/order_guard.py``); empty: unknown.
        neutral: the neutral band used.
        cpu_before, cpu_after: expected CPU seconds per sample of the given and the chosen
            order under the cost model in the module docstring; ``None`` without costs.
    """

    original: tuple[Step, ...]
    steps: tuple[Step, ...]
    order: tuple[int, ...]
    roles: tuple[Role, ...]
    factors: tuple[float | None, ...]
    sections: tuple[tuple[int, ...], ...]
    moves: tuple[StepMove, ...]
    notes: tuple[str, ...] = ()
    neutral: tuple[float, float] = NEUTRAL_BAND
    cpu_before: float | None = None
    cpu_after: float | None = None
    held: tuple[str, ...] = ()
    apart: tuple[str, ...] = ()
    keeps_shape: tuple[bool, ...] = ()

    @property
    def changed(self) -> bool:
        """True when the chosen order differs from the given one."""
        return self.order != tuple(range(len(self.order)))

    @property
    def names(self) -> tuple[str, ...]:
        """Step names in the chosen order."""
        return tuple(s.name for s in self.steps)

    def explain(self) -> list[str]:
        """Readable lines: the order, each move with its numbers, the CPU estimate, notes."""
        if self.changed:
            lines = [
                f"AutoOrder: {' -> '.join(self.names)} "
                f"(declared: {' -> '.join(s.name for s in self.original)})"
            ]
        elif self.held:
            lines = ["AutoOrder: kept the declared order (its order would have swapped steps "
                     "that share a name; see the note)"]
        elif self.apart:
            lines = ["AutoOrder: kept the declared order (its order would have swapped steps "
                     "that both change the sample's dtype or shape; see the note)"]
        else:
            lines = ["AutoOrder: kept the declared order (no movable step gains from moving)"]
        lines += [f"  {m.reason}" for m in self.moves]
        if self.cpu_before is not None and self.cpu_after is not None and self.changed:
            up = self.cpu_after > self.cpu_before * (1 + 1e-9)
            lines.append(f"  expected per-sample CPU {units.duration(self.cpu_before)} -> "
                         f"{units.duration(self.cpu_after)}{CPU_UP if up else ''} (model: a "
                         "step's CPU time is proportional to its input bytes)")
        lines += [f"  note: {n}" for n in self.notes]
        return lines


def classify(factor: float | None, neutral: tuple[float, float] = NEUTRAL_BAND) -> Role:
    """Role of an inflation factor: below, within or above the neutral band; None: unknown."""
    if factor is None or not math.isfinite(factor):
        return "unknown"
    if factor < neutral[0]:
        return "deflationary"
    if factor > neutral[1]:
        return "inflationary"
    return "neutral"


def autoorder(
    steps: Sequence[Step],
    inflation: Sequence[float | None],
    *,
    changes_type: Sequence[bool] | None = None,
    keeps_shape: Sequence[bool] | None = None,
    cpu: Sequence[float] | None = None,
    bytes_in: Sequence[float] | None = None,
    input_bytes: float | None = None,
    neutral: tuple[float, float] = NEUTRAL_BAND,
) -> AutoOrderDecision:
    """Reorder ``steps`` by their inflation factors (pure; O(n log n) in the number of steps).

    Args:
        steps: the pipeline's steps (``load`` excluded), in their declared order.
        inflation: per step, output bytes / input bytes per sample; ``None`` when unknown.
        changes_type: per step, whether it changed the sample's type, rank or dtype (a barrier).
        keeps_shape: per step, whether it kept its input's dtype and shape on every profiled
            sample; ``None``: unknown for every step, so no two movable steps swap.
        cpu: per step, CPU seconds per sample, for the estimate.
        bytes_in: per step, the input bytes per sample it was measured with, for the estimate.
        input_bytes: bytes per sample entering the first step (the source's output); default
            ``bytes_in[0]``, right when ``steps`` were measured in this order.
        neutral: the band of factors treated as 1.
    """
    n = len(steps)
    _check_len("inflation", inflation, n)
    _check_len("changes_type", changes_type, n)
    _check_len("keeps_shape", keeps_shape, n)
    keeps = list(keeps_shape) if keeps_shape is not None else [False] * n
    _check_len("cpu", cpu, n)
    _check_len("bytes_in", bytes_in, n)
    roles: list[Role] = []
    for i, s in enumerate(steps):
        if s.barrier or (changes_type is not None and changes_type[i]):
            roles.append("barrier")
        elif not s.movable:
            roles.append("fixed")
        else:
            roles.append(classify(inflation[i], neutral))
    sections: list[tuple[int, ...]] = []
    order: list[int] = []
    run: list[int] = []
    held: list[str] = []
    shape_notes: list[str] = []
    rank = [_RANK.get(r, 1) for r in roles]
    for i in [*range(n), None]:
        if i is not None and roles[i] not in ("barrier", "fixed"):
            run.append(i)
            continue
        if run:
            sections.append(tuple(run))
            chosen, kept_apart = order_section(steps, run, rank, keeps)
            shape_notes += kept_apart
            why = swaps_a_name(steps, chosen)
            if why is not None:
                held.append(why)
                chosen = run
            order += chosen
            run = []
        if i is not None:
            order.append(i)
    pos = {j: k for k, j in enumerate(order)}
    moves = []
    for sec in sections:
        for j in sec:
            role = roles[j]
            if role == "deflationary":
                crossed = [k for k in sec if k < j and pos[k] > pos[j]]
            elif role == "inflationary":
                crossed = [k for k in sec if k > j and pos[k] < pos[j]]
            else:
                continue
            if crossed:
                factor = inflation[j]
                assert factor is not None  # classified deflationary or inflationary
                moves.append(_move(steps, j, role, factor, crossed, bytes_in, neutral))
    notes = [*held, *shape_notes]
    for i, s in enumerate(steps):
        measured = classify(inflation[i], neutral)
        if roles[i] == "fixed" and measured in ("deflationary", "inflationary"):
            notes.append(
                f"{s.name} is {measured} ({factor_text(inflation[i])}) but neither random nor commutes, "
                "so it stays in place; declare it with commutes=True to let AutoOrder move it"
            )
        elif roles[i] == "barrier" and not s.barrier:
            notes.append(f"{s.name} changes the sample's type, rank or dtype: kept in place as a "
                         "barrier")
        elif roles[i] == "unknown":
            notes.append(f"no inflation factor measured for {s.name}: treated as neutral")
    before = after = None
    if cpu is not None and bytes_in is not None:
        start = input_bytes if input_bytes is not None else (bytes_in[0] if n else 0.0)
        before = expected_cpu(range(n), cpu, bytes_in, inflation, start)
        after = expected_cpu(order, cpu, bytes_in, inflation, start)
    return AutoOrderDecision(
        original=tuple(steps),
        steps=tuple(steps[j] for j in order),
        order=tuple(order),
        roles=tuple(roles),
        factors=tuple(inflation),
        sections=tuple(sections),
        moves=tuple(moves),
        notes=tuple(notes),
        neutral=neutral,
        cpu_before=before,
        cpu_after=after,
        held=tuple(held),
        apart=tuple(shape_notes),
        keeps_shape=tuple(keeps) if keeps_shape is not None else (),
    )


def stats_of(steps: Sequence[Step], profile: PipelineProfile) -> list[StepStats | None]:
    """Each step's entry in ``profile`` (None: not profiled), matched by name: the k-th step of
    a repeated name to the k-th entry of that name."""
    seen: dict[str, int] = {}
    stats: list[StepStats | None] = []
    for s in steps:
        k = seen.get(s.name, 0)
        seen[s.name] = k + 1
        try:
            stats.append(profile.step(s.name, k))
        except KeyError:
            stats.append(None)
    return stats


def autoorder_from_profile(
    steps: Sequence[Step], profile: PipelineProfile, *, neutral: tuple[float, float] = NEUTRAL_BAND
) -> AutoOrderDecision:
    """AutoOrder with factors, type changes and costs read from ``profile``.

    Steps are matched to the profile by name (:func:`stats_of`), so the profile may come from
    any order of the same steps.
    """
    stats = stats_of(steps, profile)
    load = profile.steps[0] if profile.steps and profile.steps[0].name == LOAD_STEP else None
    decision = autoorder(
        steps,
        [st.inflation if st is not None else None for st in stats],
        changes_type=[st is not None and st.changes_type for st in stats],
        keeps_shape=[st is not None and st.keeps_shape for st in stats],
        cpu=[st.cpu_mean if st is not None else 0.0 for st in stats],
        bytes_in=[st.bytes_in_mean if st is not None else 0.0 for st in stats],
        input_bytes=load.bytes_out_mean if load is not None and load.count else None,
        neutral=neutral,
    )
    notes = [f"inflation factors from {profile.sized_samples} samples"]
    for m in decision.moves:
        st = stats[m.index]
        lo = st.inflation_p10 if st is not None else None
        hi = st.inflation_p90 if st is not None else None
        if lo is not None and hi is not None and classify(lo, neutral) != classify(hi, neutral):
            notes.append(
                f"{m.step}'s inflation varies across samples (p10 {lo:.2f}, p90 {hi:.2f}): "
                "the order favours the mean volume"
            )
    return dataclasses.replace(decision, notes=(*notes, *decision.notes))


def _move(
    steps: Sequence[Step],
    j: int,
    role: Literal["deflationary", "inflationary"],
    factor: float,
    crossed: list[int],
    bytes_in: Sequence[float] | None,
    neutral: tuple[float, float],
) -> StepMove:
    names = tuple(steps[k].name for k in crossed)
    size = ""
    if bytes_in is not None and bytes_in[j] > 0:
        size = f", {units.size(bytes_in[j])} -> {units.size(bytes_in[j] * factor)} per sample"
    runs = "they run" if len(names) > 1 else "it runs"
    if role == "deflationary":
        head = f"moved {steps[j].name} before {', '.join(names)}"
        why = f"below {neutral[0]:.2f}{size}), so {runs} on smaller samples"
    else:
        head = f"moved {steps[j].name} after {', '.join(names)}"
        why = f"above {neutral[1]:.2f}{size}), so {runs} before the samples grow"
    reason = f"{head}: inflation {factor:.2f} ({role}, {why}"
    return StepMove(steps[j].name, j, role, factor, names, reason)


def _check_len(what: str, seq: Sequence[object] | None, n: int) -> None:
    if seq is not None and len(seq) != n:
        raise ValueError(f"autoorder: {what} has {len(seq)} entries for {n} steps")


def factor_text(x: float | None) -> str:
    """An inflation factor in words: two decimals, or ``unknown``."""
    return "unknown" if x is None else f"{x:.2f}"
