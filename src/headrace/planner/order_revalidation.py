"""Whether an AutoOrder decision still holds under a newer profile (Pecan re-checks the order
after the first epoch; ``planner/order.py`` keeps one that holds)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from headrace.planner.autoorder import AutoOrderDecision, autoorder_from_profile, factor_text

if TYPE_CHECKING:
    from headrace.profiler.report import PipelineProfile


@dataclasses.dataclass(frozen=True)
class Revalidation:
    """Whether a decision still holds under a newer profile (Pecan re-checks after epoch 1).

    ``decision`` is AutoOrder recomputed from the new profile on the declared steps;
    ``changes`` lists the steps whose role changed, with the numbers. ``planner/order.py``
    keeps a decision that holds and otherwise goes back to the declared order (not to
    ``decision``, which would be another order not yet validated).
    """

    holds: bool
    decision: AutoOrderDecision
    changes: tuple[str, ...]


def revalidate(decision: AutoOrderDecision, new_profile: PipelineProfile) -> Revalidation:
    """Recompute AutoOrder on the declared steps with ``new_profile`` (e.g. after epoch 1).

    The order holds when the recomputed order is the same; the new profile may have been
    measured on the reordered pipeline (steps are matched by name).
    """
    fresh = autoorder_from_profile(decision.original, new_profile, neutral=decision.neutral)
    changes = []
    for i, s in enumerate(decision.original):
        old, new = decision.roles[i], fresh.roles[i]
        if old != new:
            changes.append(
                f"{s.name}: {old} ({factor_text(decision.factors[i])}) -> {new} ({factor_text(fresh.factors[i])})"
            )
    return Revalidation(fresh.order == decision.order, fresh, tuple(changes))
