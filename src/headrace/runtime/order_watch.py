"""The runtime's side of AutoOrder's per-sample check (``pipeline/order_guard.py``).

A runner of a reordered pipeline gets an :class:`OrderGuard` with the profiler's shape signature;
when a sample breaks the order's premise, its worker says so once in its log and records the
step in its slot (``Progress.order_broke``); the training process reads the slots when the
epoch releases its pool (``Monitor.read_order_watch``), and AutoOrder goes back to the
declared order at the next epoch boundary. The in-process loader (``num_workers=0``) tells the
monitor directly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from headrace.pipeline import Pipeline
from headrace.pipeline.order_guard import OrderGuard
from headrace.profiler import sizes

log = logging.getLogger("headrace")


def guard_for(pipeline: Pipeline, report: Callable[[int, str], None]) -> OrderGuard | None:
    """The guard for the runners of ``pipeline`` (None: it runs its declared order).
    ``report(step, why)``: the executed position of the first step seen breaking the premise,
    and why, in words; called once, and logged once, by this guard."""
    guard = OrderGuard.of(pipeline, sizes.shape_signature)
    if guard is None:
        return None

    def broke(step: int) -> None:
        why = guard.says(step)
        log.warning("headrace: AutoOrder's step order did not hold: %s; the declared order "
                    "runs from the next epoch (docs/design.md, \"AutoOrder changes the order "
                    "only between epochs\")", why)
        report(step, why)

    guard.on_broke = broke
    return guard


def why_broken(pipeline: Pipeline, step: int) -> str:
    """``OrderGuard.says`` for the executed position ``step`` of ``pipeline`` (reordered)."""
    guard = OrderGuard.of(pipeline, sizes.shape_signature)
    assert guard is not None
    return guard.says(step)
