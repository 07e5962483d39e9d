"""``executor="auto"`` in the training process: what the probing worker pools measured, added
up across pools (each epoch has its own unless ``persistent_workers``), and the decision
``planner/executor.py`` takes from it. The workers measure (``runtime/gilprobe.py`` for the
GIL, ``SampleRunner.on_global_draw`` for draws from the global generators)."""

from __future__ import annotations

import weakref
from typing import Any

from headrace.planner.executor import (
    ExecutorDecision,
    choose_executor,
    forced_processes,
    global_draw_reason,
)
from headrace.planner.workers import rank_cpus


class ExecutorProbes:
    """The GIL probes' totals (seconds of step time held and watched) of the pools seen so far."""

    def __init__(self) -> None:
        self._pool: Any = lambda: None  # weakref to the pool whose probes were read last
        self._last = (0.0, 0.0)  # (held, probed) seconds read from that pool
        self._banked = (0.0, 0.0)  # the same, from earlier pools

    def decide(self, pool: Any) -> ExecutorDecision | None:
        """The decision once enough was probed (None: not yet); processes at once when a step
        of ``pool``'s workers was seen drawing from the global random generators."""
        if self._pool() is not pool:
            self._banked = (self._banked[0] + self._last[0], self._banked[1] + self._last[1])
            self._pool = weakref.ref(pool)
        prog = pool.progress
        drew = max(prog.global_draw)
        if drew:  # threads would share the generators that worker processes re-seed
            return forced_processes(global_draw_reason(pool.pipeline.step_names[drew - 1]))
        self._last = (sum(prog.gil_held), sum(prog.gil_probed))
        return choose_executor(self._banked[0] + self._last[0], self._banked[1] + self._last[1],
                               max(1, pool.size), rank_cpus())
