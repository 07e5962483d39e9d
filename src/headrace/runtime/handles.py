"""What the training process keeps of each worker (``WorkerHandle``) and the arrays it shares
with all of them without locks (``HandOff``, ``Progress``); ``runtime/pool.py`` starts and stops
the workers behind them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headrace.runtime.ring import Ring
from headrace.runtime.state_watch import ATTR_BYTES
from headrace.runtime.taskpipe import TaskPipe
from headrace.runtime.threadworker import ThreadTasks
from headrace.runtime.worker import Task, Tasks


class HandOff:
    """What a worker needs to decide a hand-off, shared without locks.

    ``timeout.value``: the learned timeout in seconds (``inf``: none yet). ``remaining[i]``:
    typical seconds of steps ``i..n-1`` (sum of their median times; ``inf`` unknown).
    """

    def __init__(self, ctx: Any, steps: int) -> None:
        self.timeout = ctx.RawValue("d", math.inf)
        self.remaining = ctx.RawArray("d", [math.inf] * (steps + 1))


REVOKED_KEPT = 2
"""Revoked task ids a worker slot remembers: as many as a worker still starting holds
(``dispatch.DEPTH``), all of which move when a ready worker idles (``Dispatcher._steal``); one
slot let the worker run the first moved one anyway, once it started (wasted, its result
dropped as stale)."""


class Progress:
    """Shared arrays, one entry per worker slot, written by workers without locks.

    ``tid[slot]``: task id being run (−1: idle); ``started[slot]``: ``time.monotonic()`` when
    it started (seconds); ``step[slot]``: execution step it is in (0 = load). Written by the
    main process: ``revoked``: per slot, the last ``REVOKED_KEPT`` queued task ids the worker
    must skip (moved to another worker; see ``Dispatcher._steal``, :meth:`revoke`).
    ``gil_held[slot]`` / ``gil_probed[slot]``: seconds of step time a worker process's GIL
    probe saw held / watched (``runtime/gilprobe.py``).
    ``global_draw[slot]``: 1 + the position of the first step a probing worker saw draw from
    the global random generators (0: none seen; kept when the slot's worker is replaced).
    ``worker_info_read[slot]``: the same for the first step a probing worker saw call
    ``get_worker_info()`` (``torch_worker.watch_worker_info_reads``).
    ``state_changed[slot]``: 1 + the position of the first step (0: the source's ``load``)
    whose object a probing worker saw gain or rebind an attribute, and ``state_attr`` (per
    slot, ``state_watch.ATTR_BYTES`` bytes) its name (``runtime/state_watch.py``).
    ``probe_stop``: set by the main process once ``executor="auto"`` decided: the GIL probes
    stop. ``order_broke[slot]``: 1 + the executed position of the first step the slot's
    workers saw break AutoOrder's order (0: none; ``runtime/order_watch.py``).
    ``kept``: per step position, whether a worker said it kept a sample after that step
    (``runtime/kept_said.py``: shared by all slots, no lock; None: each worker process
    says it once).
    """

    def __init__(self, ctx: Any, slots: int, kept: Any = None) -> None:
        self.tid = ctx.RawArray("q", [-1] * slots)
        self.started = ctx.RawArray("d", slots)
        self.step = ctx.RawArray("i", slots)
        self.revoked = ctx.RawArray("q", [-1] * (slots * REVOKED_KEPT))
        self._next_revoked = [0] * slots  # the main process's write position per slot
        self.gil_held = ctx.RawArray("d", slots)
        self.gil_probed = ctx.RawArray("d", slots)
        self.global_draw = ctx.RawArray("i", slots)
        self.worker_info_read = ctx.RawArray("i", slots)
        self.state_changed = ctx.RawArray("i", slots)
        self.state_attr = ctx.RawArray("c", slots * ATTR_BYTES)
        self.probe_stop = ctx.RawValue("i", 0)
        self.order_broke = ctx.RawArray("i", slots)
        self.kept = kept

    def revoke(self, slot: int, tid: int) -> None:
        """(Main process) the worker in ``slot`` must skip queued task ``tid``; the slot keeps
        the last ``REVOKED_KEPT`` such ids."""
        k = self._next_revoked[slot]
        self.revoked[slot * REVOKED_KEPT + k] = tid
        self._next_revoked[slot] = (k + 1) % REVOKED_KEPT

    def is_revoked(self, slot: int, tid: int) -> bool:
        """(Worker) whether queued task ``tid`` of ``slot`` moved to another worker."""
        return tid in self.revoked[slot * REVOKED_KEPT:(slot + 1) * REVOKED_KEPT]

    def clear_revoked(self, slot: int) -> None:
        """(Main process) a new worker in ``slot``: its predecessor's revocations do not carry
        over."""
        for k in range(REVOKED_KEPT):
            self.revoked[slot * REVOKED_KEPT + k] = -1
        self._next_revoked[slot] = 0


@dataclass(eq=False)
class WorkerHandle:
    """One worker process and what the main process has assigned to it."""

    slot: int
    process: Any
    tasks: TaskPipe | ThreadTasks  # Task | None (exit) to the worker
    conn: Any  # multiprocessing.connection.Connection, read end of the result pipe
    ring: Ring | None  # where the worker puts finished samples' arrays (None: a thread)
    assigned: dict[int, Task] = field(default_factory=dict)
    ready: bool = False
    eager: bool = False  # started with the pool: gets work before it says it is ready
    retiring: bool = False
    external: bool = False  # started by a backend (remote/): the pool does not restart it
    gate: Callable[[], bool] | None = None  # a backend's dispatch limit (remote/: offload ratio)
    prefers_slow: bool = False  # takes slow-lane samples first, beyond the slow-lane share
    fetches: bool = False  # near storage: while one runs, fresh samples go to such workers only
    runs: Callable[[Task], bool] | None = None  # a backend's limit on the resumed samples it
    # takes (remote/: those with steps left before its split point; None: any)
    took: Callable[[int], None] | None = None  # a backend's count of the results the
    # scheduler takes, by task id (remote/: offloaded, handed off); never a stale one's
    started: float = field(default_factory=time.monotonic)  # its start (time.monotonic(), s)

    @property
    def sentinel(self) -> int:
        return self.process.sentinel

    def send(self, task: Task) -> None:
        self.assigned[task.tid] = task
        self._write(task)

    def send_many(self, tasks: list[Task], hold_s: float) -> None:
        """Assign ``tasks`` and write them in one message (a worker process only): the worker
        may keep what it finishes for ``hold_s`` seconds of work and send it in one message
        (``planner/queueing.py``). One task with nothing to hold travels as a plain ``Task``."""
        for task in tasks:
            self.assigned[task.tid] = task
        if len(tasks) == 1 and hold_s <= 0:
            self._write(tasks[0])
        else:  # plain tuples: a third of the pickling time of named ones
            self._write(Tasks([tuple(t) for t in tasks], hold_s))

    def _write(self, obj: Any) -> None:
        try:
            self.tasks.send(obj)
        except OSError:
            pass  # the worker is gone: its death is handled by its sentinel, tasks re-run

    @property
    def is_thread(self) -> bool:
        """A worker thread (``runtime/threadworker.py``): no ring, results are objects."""
        return self.ring is None

    def send_exit(self, now: bool = False) -> None:
        """Ask the worker to exit once its queued tasks are done (best effort); ``now``: once
        the sample it runs is done (a thread; a process reads ``None`` only after the samples
        queued in it, up to ``planner.queueing.MAX_DEPTH``). A process gets ``None`` either way:
        closing our end of its pipe would not reach it, as workers forked later hold copies of
        that end."""
        if now and self.is_thread:
            self.tasks.close()
            return
        try:
            self.tasks.send(None)
        except OSError:
            pass
