"""``executor="auto"`` in the training process: what the probing worker pools measured, added
up across pools (each epoch has its own unless ``persistent_workers``), and the decision
``planner/executor.py`` takes from it. The workers measure (``runtime/gilprobe.py`` for the
GIL, ``SampleRunner.on_global_draw`` for draws from the global generators,
``torch_worker.watch_worker_info_reads`` for calls of ``get_worker_info()``,
``runtime/state_watch.py`` for attributes the source or a step object sets)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from torch.utils.data._utils import collate as torch_collate

from headrace.planner.executor import (
    ExecutorDecision,
    after_trial,
    choose_executor,
    forced_processes,
    global_draw_reason,
    pooled_rate,
    state_reason,
    worker_info_reason,
)
from headrace.planner.workers import rank_cpus
from headrace.runtime.state_watch import attr_of

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader


class ExecutorProbes:
    """The GIL probes' totals (seconds of step time held and watched) of the pools seen so far,
    and the samples per second of the epochs on each executor (threads' trial)."""

    def __init__(self) -> None:
        self._pool: Any = lambda: None  # weakref to the pool whose probes were read last
        self._last = (0.0, 0.0)  # (held, probed) seconds read from that pool
        self._banked = (0.0, 0.0)  # the same, from earlier pools
        self._processes_rate: float | None = None  # samples/s of the last epochs on processes
        self._tried = False  # threads had their trial
        # (samples, wall seconds) of the consecutive epochs on each executor not yet pooled
        # into a rate (planner.executor.pooled_rate)
        self._windows = {"processes": (0.0, 0.0), "threads": (0.0, 0.0)}

    @property
    def probed_s(self) -> float:
        """Seconds of step time the GIL probes watched so far (the decision needs
        ``planner.executor.MIN_PROBED_S``)."""
        return self._banked[1] + self._last[1]

    def after_epoch(self, executor: str, wall_s: float, samples_per_s: float,
                    decision: ExecutorDecision | None) -> ExecutorDecision | None:
        """The decision once an epoch that ran on ``executor`` closed (``wall_s`` seconds,
        ``samples_per_s`` delivered): threads' first epochs, added up until they are long
        enough to tell (``TRIAL_MIN_S``, ``planner.executor.pooled_rate``), are compared with
        the last such epochs on processes (``planner.executor.after_trial``); processes when the last probing pool's
        workers saw what threads would change (:meth:`_forced`) in samples that came in after
        the last :meth:`decide`; otherwise ``decision`` as it was."""
        if decision is None or decision.executor == "threads":
            forced = self._forced(self._pool())  # seen after the epoch's last decide():
            if forced is not None:  # the scheduler ticks no more once the last sample is in
                return forced
        other = "threads" if executor == "processes" else "processes"
        samples, seconds = self._windows[other]
        if other == "processes" and seconds > 0 and self._processes_rate is None:
            # processes' epochs before the switch, however short: the only rate there is
            # (2 busy workers decide within half a second: the trial never ran, a review)
            self._processes_rate = samples / seconds
        self._windows[other] = (0.0, 0.0)  # only consecutive epochs are added up
        self._windows[executor], rate = pooled_rate(self._windows[executor],
                                                    samples_per_s * wall_s, wall_s)
        if executor == "processes":
            if rate is not None:
                self._processes_rate = rate
            return decision
        if (decision is None or decision.executor != "threads" or self._tried
                or rate is None or self._processes_rate is None):
            return decision
        self._tried = True
        return after_trial(decision, rate, self._processes_rate)

    def decide(self, pool: Any, decision: ExecutorDecision | None) -> ExecutorDecision | None:
        """``decision`` once ``pool`` (a probing pool) measured more: made once enough was
        probed (None: not yet), and processes at once when a step of its workers was seen
        drawing from the global random generators or calling ``get_worker_info()``, also after
        a choice of threads (their watch covers every sample of the probing epoch, which may
        come after enough probing)."""
        if self._pool() is not pool:
            self._banked = (self._banked[0] + self._last[0], self._banked[1] + self._last[1])
            self._pool = weakref.ref(pool)
        prog = pool.progress
        if decision is not None and decision.executor == "processes":
            return decision
        forced = self._forced(pool)
        if forced is not None:
            return forced
        if decision is not None:
            return decision
        self._last = (sum(prog.gil_held), sum(prog.gil_probed))
        return choose_executor(self._banked[0] + self._last[0], self._banked[1] + self._last[1],
                               max(1, pool.own_workers), rank_cpus())

    @staticmethod
    def _forced(pool: Any) -> ExecutorDecision | None:
        """Processes, when a worker of ``pool`` (a probing pool, or None) saw a step do what
        threads would change: draw from the global generators (worker processes re-seed them,
        threads share them), call ``get_worker_info()`` (None in a thread), or set an
        attribute of its object or the source's (per worker in processes, shared by threads:
        ``runtime/state_watch.py``)."""
        if pool is None:
            return None
        prog, names = pool.progress, pool.pipeline.step_names
        drew = max(prog.global_draw)
        if drew:
            return forced_processes(global_draw_reason(names[drew - 1]))
        read = max(prog.worker_info_read)
        if read:
            return forced_processes(worker_info_reason(names[read - 1]))
        for slot, changed in enumerate(prog.state_changed):
            if changed:
                return forced_processes(state_reason(names[changed - 1], attr_of(prog, slot)))
        return None


def threads_blocked(loader: DataLoader) -> str | None:
    """Why ``executor="auto"`` may not choose threads here (None: it may)."""
    if not loader.num_workers or loader.pipeline is None:
        return "no worker processes to replace (num_workers=0 or an IterableDataset)"
    if loader.pipeline.opaque or loader.pipeline.embedded:
        return ("the dataset's own __getitem__ runs the steps: threads would share its "
                "global random generators, which worker processes re-seed per sample")
    if loader.worker_init_fn is not None:
        return "worker_init_fn needs worker processes"
    if loader.collate_fn is not torch_collate.default_collate:
        return "a collate_fn of your own would receive objects shared between threads"
    if loader.options.sample_timeout_s is not None:
        return "sample_timeout_s needs worker processes (a thread cannot be killed)"
    if loader.options.remote is not None:
        return "remote workers run beside local worker processes"
    return None
