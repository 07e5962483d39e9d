"""Which step order to run this epoch: AutoOrder applied at epoch boundaries (pure).

Pecan decides from the first ~300 profiled samples and re-validates after the first epoch. In
headrace the order can change only between epochs (a sample never changes order mid-flight, and
a hand-off's "next step" keeps its meaning): each epoch starts from the freshest profile with
enough samples, which re-validates the previous decision on the reordered pipeline itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from headrace.pipeline import Step
from headrace.planner.autoorder import AutoOrderDecision, autoorder_from_profile
from headrace.profiler.report import PipelineProfile

MIN_PROFILE_SAMPLES = 300
"""Samples profiled before AutoOrder decides (Pecan: the first ~300). Every sample whose steps
ran counts, in a worker or not (``PipelineProfile.samples``), so a dataset of at least 300
samples reaches it within its first epoch; the inflation factors come from the subset whose
sizes were measured (``PipelineProfile.sized_samples``: at least 64 per worker)."""


@dataclasses.dataclass(frozen=True)
class OrderPlan:
    """The executed order and why."""

    steps: tuple[Step, ...]
    decision: AutoOrderDecision | None
    reason: str

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
) -> OrderPlan:
    """The order for the next epoch.

    ``declared``: the user's order; ``current``: the order run so far; ``profile``: the freshest
    profile (``profile_source`` says where it comes from: "this run", "stored profile").
    ``embedded``: the steps run inside a dataset's ``__getitem__`` (never moved).
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
    if profile is None or profile.samples < min_samples:
        have = 0 if profile is None else profile.samples
        return OrderPlan(
            current, None,
            f"order: unchanged until {min_samples} samples are profiled ({have} were when it was "
            "planned)",
        )
    decision = autoorder_from_profile(declared, profile)
    verb = ("reordered by AutoOrder" if decision.changed
            else "as declared (AutoOrder's order would swap steps that share a name)"
            if decision.held else "as declared (AutoOrder found no better order)")
    return OrderPlan(
        tuple(decision.steps), decision,
        f"order: {verb}, from {profile.samples} samples ({profile_source})",
    )
