"""Which step order to run this epoch: AutoOrder applied at epoch boundaries (pure).

Pecan decides from the first ~300 profiled samples and validates once after the first epoch. In
headrace the order can change only between epochs (a sample never changes order mid-flight, and
a hand-off's "next step" keeps its meaning), and a run goes through three phases
(``OrderPlan.phase``):

- ``"undecided"``: the declared order (or the order a state dict restored) runs until a profile
  (this run's, or a stored one) has enough samples; AutoOrder then decides from it, and again
  at each epoch's end while it keeps the order that runs (nothing to validate then).
- ``"validating"``: the decided order runs until this run has profiled enough samples *in it*;
  AutoOrder recomputed from that profile must give the same order. If it does, the order is
  kept; if not, the declared order is, for the rest of the run.
- ``"kept"``: nothing changes any more.

Inflation factors depend on the order they were measured in (a pad to 1024 is neutral after a
step that doubles 600 to 1200, inflationary before it), so re-planning every epoch from the
profile of the order just run flipped such a pair every epoch, and the output's size with it.
Deciding once and validating once bounds a run to at most two order changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Literal

from headrace.pipeline import Step
from headrace.planner.autoorder import AutoOrderDecision, autoorder_from_profile
from headrace.planner.order_revalidation import revalidate
from headrace.profiler.report import PipelineProfile

MIN_PROFILE_SAMPLES = 300
"""Samples profiled before AutoOrder decides (Pecan: the first ~300). Every sample whose steps
ran counts, in a worker or not (``PipelineProfile.samples``), so a dataset of at least 300
samples reaches it within its first epoch; the inflation factors come from the subset whose
sizes were measured (``PipelineProfile.sized_samples``: at least 64 per worker)."""


Phase = Literal["undecided", "validating", "kept"]
PHASES: tuple[Phase, ...] = ("undecided", "validating", "kept")


@dataclasses.dataclass(frozen=True)
class OrderPlan:
    """The executed order and why; ``phase``: where the run stands once this plan is adopted
    (module docstring)."""

    steps: tuple[Step, ...]
    decision: AutoOrderDecision | None
    reason: str
    phase: Phase = "undecided"

    def lines(self) -> list[str]:
        if self.decision is None:
            return [self.reason]
        return [self.reason, *self.decision.explain()]


def plan_order(
    declared: Sequence[Step],
    current: Sequence[Step],
    profile: PipelineProfile | None,
    profile_source: str,
    enabled: bool,
    min_samples: int = MIN_PROFILE_SAMPLES,
    embedded: bool = False,
    previous: OrderPlan | None = None,
    rejected: Collection[tuple[str, ...]] = (),
    broke: str | None = None,
) -> OrderPlan:
    """The order for the next epoch.

    ``declared``: the user's order; ``current``: the order run so far; ``profile``: the freshest
    profile (``profile_source`` says where it comes from: "this run", "stored profile"); while
    validating, it must be this run's profile of ``current`` only. ``embedded``: the steps run
    inside a dataset's ``__getitem__`` (never moved). ``previous``: the plan adopted last
    (``None``: none yet), whose ``phase`` says what this call does. ``rejected``: orders (step
    names) that did not hold when validated, in this run or an earlier one of the job
    (``PipelineProfile.rejected_orders``): decided again, they are not run; the order that runs
    is kept for the rest of the run. ``broke``: why a sample broke the premise of ``current``
    (``pipeline/order_guard.py``; None: none did): in whatever phase, the declared order runs
    for the rest of the run.
    """
    declared, current = tuple(declared), tuple(current)
    if embedded:
        return OrderPlan(declared, None, "order: as the dataset calls its transforms (measured "
                         "where its __getitem__ runs them; never split or reordered, so what it "
                         "computes is unchanged)")
    if not enabled:
        return OrderPlan(declared, None, "order: as declared (reorder=False)")
    if not any(s.movable for s in declared):
        return OrderPlan(
            declared, None,
            "order: as declared (no step is random=True or commutes=True, so none may move)",
        )
    if broke is not None and any(a is not b for a, b in zip(current, declared, strict=True)):
        return OrderPlan(declared, None, (
            f"order: as declared for the rest of the run: AutoOrder's order "
            f"{' -> '.join(s.name for s in current)} did not hold: {broke}"), "kept")
    phase = previous.phase if previous is not None else "undecided"
    if previous is not None and phase == "kept":
        return previous
    have = 0 if profile is None else profile.samples
    if previous is not None and phase == "validating":
        if profile is None or have < min_samples:
            return dataclasses.replace(previous, reason=(
                f"{previous.reason.split('; validated once')[0]}; validated once {min_samples} "
                f"samples are profiled in this order ({have} were when it was planned)"))
        if previous.decision is not None:
            check = revalidate(previous.decision, profile)
            fresh, changes = check.decision, check.changes
        else:  # restored from a state dict: the decision's numbers are not kept there
            fresh, changes = autoorder_from_profile(declared, profile), ()
        if len(fresh.steps) == len(previous.steps) and all(
                a is b for a, b in zip(fresh.steps, previous.steps, strict=True)):
            return OrderPlan(previous.steps, fresh, (
                f"order: {_verb(fresh)}, validated on {have} samples profiled in this "
                "order (kept for the rest of the run)"), "kept")
        why = "; ".join(changes) or "the factors measured in this order differ"
        return OrderPlan(declared, None, (
            f"order: as declared for the rest of the run: AutoOrder's order "
            f"{' -> '.join(s.name for s in previous.steps)} did not hold on {have} samples "
            f"profiled in it (it would now run {' -> '.join(fresh.names)}; {why}): "
            "inflation factors, or whether a step keeps the shape, depend on the order they "
            "were measured in"), "kept")
    if profile is None or have < min_samples:
        return OrderPlan(
            current, None,
            f"order: unchanged until {min_samples} samples are profiled ({have} were when it was "
            "planned)",
        )
    decision = autoorder_from_profile(declared, profile)
    moved = len(decision.steps) != len(current) or any(
        a is not b for a, b in zip(decision.steps, current, strict=True))
    if moved and tuple(decision.names) in rejected:
        return OrderPlan(current, None, (
            f"order: as {'declared' if current == declared else 'it runs'} for the rest of the "
            f"run: AutoOrder's order {' -> '.join(decision.names)} did not hold when validated "
            "earlier (recorded with the stored profile), so it is not run again"), "kept")
    # an order that runs already has nothing to validate: the next epoch decides again (a
    # profile stored before the shapes were recorded read no step as keeping its shape and
    # kept the declared order "validating", then for the whole run)
    return OrderPlan(
        tuple(decision.steps), decision,
        f"order: {_verb(decision)}, from {profile.samples} samples ({profile_source})",
        "validating" if moved else "undecided",
    )


def _verb(decision: AutoOrderDecision) -> str:
    return ("reordered by AutoOrder" if decision.changed
            else "as declared (AutoOrder's order would swap steps that share a name)"
            if decision.held
            else "as declared (AutoOrder's order would swap steps that both change the shape)"
            if decision.apart else "as declared (AutoOrder found no better order)")
