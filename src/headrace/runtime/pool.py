"""Worker processes: start, replace, retire, and stop them.

NOTE [headrace shutdown]
------------------------
Written once here; every loop that blocks points to it.

* Every blocking call polls: workers wait on their task pipe for at most ``worker.POLL_S`` and
  exit when their parent is gone (the training process was SIGKILLed); the scheduler thread
  waits on result pipes, process sentinels and its wake-up pipe for at most ``scheduler.POLL_S``
  and exits when its stop event is set.
* ``WorkerPool.shutdown()`` is idempotent. It sends ``None`` to every task pipe (and closes a
  worker thread's queue, so it exits after the sample it runs), gives workers
  ``grace_s`` to exit on their own, then terminates and finally kills the rest, joins them, and
  closes every pipe and queue (called in one of its own worker threads, which happens when the
  garbage collector finalises an epoch there, it waits for no worker). Samples still in flight
  are discarded: they were never delivered, so nothing is lost (resume re-runs them) and
  nothing is duplicated. A running epoch's scheduler that sees workers exit once the pool
  is closed does not count them as deaths (no warning, nothing queued to re-run).
* Who calls it: the epoch iterator when the epoch ends (unless ``persistent_workers``), when it
  is garbage-collected (``break`` out of the loop, an exception in the training loop), the loader
  when it is deleted, and an ``atexit`` hook holding weak references at interpreter exit.
  Workers are daemonic, so even a missed call cannot outlive the interpreter.
* Shared memory: tensors travel with torch's ``file_descriptor`` strategy; segments are unlinked
  at creation and vanish with the last process holding them, so a killed process leaks none.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headrace.pipeline import Pipeline
from headrace.runtime.native_threads import resolved_for_fork
from headrace.runtime.ring import Ring
from headrace.runtime.taskpipe import TaskPipe
from headrace.runtime.threadworker import (
    ThreadResults,
    ThreadRun,
    ThreadTasks,
    current_run,
    thread_main,
)
from headrace.runtime.worker import Task, Tasks, WorkerSetup, worker_main


class HandOff:
    """What a worker needs to decide a hand-off, shared without locks.

    ``timeout.value``: the learned timeout in seconds (``inf``: none yet). ``remaining[i]``:
    typical seconds of steps ``i..n-1`` (sum of their median times; ``inf`` unknown).
    """

    def __init__(self, ctx: Any, steps: int) -> None:
        self.timeout = ctx.RawValue("d", math.inf)
        self.remaining = ctx.RawArray("d", [math.inf] * (steps + 1))


class Progress:
    """Shared arrays, one entry per worker slot, written by workers without locks.

    ``tid[slot]``: task id being run (−1: idle); ``started[slot]``: ``time.monotonic()`` when
    it started (seconds); ``step[slot]``: execution step it is in (0 = load). Written by the
    main process: ``revoked[slot]``: a queued task id the worker must skip (it was moved to
    another worker; see ``Dispatcher._steal``). ``gil_held[slot]`` / ``gil_probed[slot]``: seconds
    of step time a worker process's GIL probe saw held / watched (``runtime/gilprobe.py``).
    ``global_draw[slot]``: 1 + the position of the first step a probing worker saw draw from
    the global random generators (0: none seen; kept when the slot's worker is replaced).
    ``probe_stop``: set by the main process once ``executor="auto"`` decided: the GIL probes
    stop.
    """

    def __init__(self, ctx: Any, slots: int) -> None:
        self.tid = ctx.RawArray("q", [-1] * slots)
        self.started = ctx.RawArray("d", slots)
        self.step = ctx.RawArray("i", slots)
        self.revoked = ctx.RawArray("q", [-1] * slots)
        self.gil_held = ctx.RawArray("d", slots)
        self.gil_probed = ctx.RawArray("d", slots)
        self.global_draw = ctx.RawArray("i", slots)
        self.probe_stop = ctx.RawValue("i", 0)


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


class WorkerPool:
    """A set of worker processes over one pipeline, with per-worker task and result pipes.

    Per-worker pipes (not one shared queue) so that a worker killed by the OS can hold no lock
    another worker needs, and the main process knows exactly which samples it held.
    ``executor="threads"``: the workers are threads of this process behind the same handles
    (``runtime/threadworker.py``).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        dataset: Any,
        ctx: Any,
        worker_init_fn: Any,
        base_seed: int,
        max_slots: int,
        profile: bool | str = True,
        executor: str = "processes",
        cache: Any = None,
        probe_gil: bool = False,
        blas_threads: int | None = None,
    ) -> None:
        self.executor = executor  # validated by Options
        self.blas_threads = blas_threads  # worker processes' native pools (Options)
        self.probe_gil = probe_gil  # worker processes measure their steps' GIL share
        self.cache = cache  # a cache.client.CacheClient for the workers, or None
        self.pipeline = pipeline
        self.dataset = dataset
        self.ctx = ctx
        self.worker_init_fn = worker_init_fn
        self.base_seed = base_seed
        self.max_slots = max_slots
        self.profile = profile
        self.handoff = HandOff(ctx, len(pipeline.step_names))
        """Shared hand-off timeout and expected remaining step time, read by workers."""
        self.progress = Progress(ctx, max_slots)
        """What each worker slot is running (see ``Progress``)."""
        self.workers: dict[int, WorkerHandle] = {}
        self.tids = itertools.count()
        """Task ids, unique over the pool's life (persistent workers span epochs)."""
        self._closed = False
        self._lock = threading.RLock()  # shutdown (atexit, finalizers) races the scheduler thread
        _live_pools.add(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size(self) -> int:
        """Workers not being retired."""
        return sum(not w.retiring for w in self.workers.values())

    def start(self, n: int, on_added: Any = None) -> None:
        """Start ``n`` workers; ``on_added()`` after each (e.g. wake the scheduler thread so it
        watches the new worker's pipe now rather than at its next poll timeout)."""
        forks = self.executor != "threads" and self.ctx.get_start_method() == "fork"
        if forks:
            # Each worker seeds NumPy's global generator, as torch's do; NumPy 2 imports
            # numpy.random on first use (5 ms alone, 39-117 ms a worker measured on 16 cores
            # while the others fork, the import's writes copying the pages they touch).
            # Imported once here, every forked worker has it.
            import numpy.random  # noqa: F401
        with (resolved_for_fork() if forks and self.blas_threads is not None
              else contextlib.nullcontext()):
            self._start(n, on_added)

    def _start(self, n: int, on_added: Any) -> None:
        for _ in range(n):
            h = self.add_worker(num_workers=n)
            if h is None:
                return  # closed, or every slot taken
            # as torch's workers, the pool's first ones find their first samples waiting in
            # their pipe when they have started: no round trip through the scheduler thread
            # after each start (docs/design.md, "The pool's first workers get work...")
            h.eager = not h.is_thread
            if on_added is not None:
                on_added()

    def add_worker(self, slot: int | None = None, num_workers: int | None = None,
                   start: Callable[[WorkerSetup], WorkerHandle] | None = None
                   ) -> WorkerHandle | None:
        """Start one worker in ``slot`` (default: the lowest free slot); None once closed, or
        when every slot is taken (the scaler, on the scheduler thread, may fill them while
        ``start`` still forks its first workers). ``start(setup)``: a backend's own kind of
        worker (``remote/``) instead of the pool's."""
        with self._lock:
            if self._closed:
                return None
            if slot is None and len(self.workers) >= self.max_slots:
                return None
            return self._add_worker(slot, num_workers, start)

    def _add_worker(self, slot: int | None, num_workers: int | None,
                    start: Callable[[WorkerSetup], WorkerHandle] | None = None) -> WorkerHandle:
        if slot is None:
            slot = next(i for i in range(self.max_slots) if i not in self.workers)
        setup = WorkerSetup(
            slot=slot,
            num_workers=num_workers if num_workers is not None else max(self.size, slot + 1),
            base_seed=self.base_seed,
            pipeline=self.pipeline,
            dataset=self.dataset,
            worker_init_fn=self.worker_init_fn,
            parent_pid=os.getpid(),
            profile=self.profile,
            cache=self.cache,
            probe_gil=self.probe_gil,
            blas_threads=self.blas_threads,
        )
        self.progress.tid[slot] = -1
        self.progress.gil_held[slot] = self.progress.gil_probed[slot] = 0.0
        self.progress.revoked[slot] = -1  # a dead predecessor's revocation does not carry over
        if start is None:
            start = self._start_thread if self.executor == "threads" else self._start_process
        h = self.workers[slot] = start(setup)
        return h

    def _start_process(self, setup: WorkerSetup) -> WorkerHandle:
        reader, writer = self.ctx.Pipe(duplex=False)
        task_reader, task_writer = self.ctx.Pipe(duplex=False)
        ring = Ring(self.ctx)
        slot = setup.slot
        proc = self.ctx.Process(
            target=worker_main,
            args=(setup, task_reader, writer, self.handoff, self.progress, ring),
            daemon=True,
            name=f"headrace-worker-{slot}",
        )
        if self.ctx.get_start_method() == "fork":
            # the child's garbage collector leaves what it inherited alone: no __del__ of the
            # training process's garbage runs in a worker (a temporary directory's cleanup,
            # another loader's shutdown), and no page of the dataset's Python objects is
            # copied for the collector's bookkeeping (docs/design.md)
            gc.freeze()
            try:
                proc.start()
            finally:
                gc.unfreeze()  # the training process collects as before
        else:
            proc.start()
        writer.close()  # only the worker writes; EOF on our end then means it died
        task_reader.close()  # only the worker reads
        return WorkerHandle(slot, proc, TaskPipe(task_writer), reader, ring)

    def _start_thread(self, setup: WorkerSetup) -> WorkerHandle:
        tasks, results = ThreadTasks(), ThreadResults()
        run = ThreadRun(thread_main, (setup, tasks, results, self.handoff, self.progress),
                        name=f"headrace-worker-{setup.slot}")
        run.start()
        return WorkerHandle(setup.slot, run, tasks, results, None)

    def replace(self, dead: WorkerHandle) -> WorkerHandle | None:
        """Discard a dead worker and start a fresh one in its slot (None once closed, or for a
        backend's worker: its backend decides whether and where to start another)."""
        with self._lock:
            if self._closed:
                return None
            self._dispose(dead, grace_s=0.0)
            if dead.external:
                return None
            return self._add_worker(dead.slot, None)

    def retire(self, h: WorkerHandle) -> None:
        """Ask a worker to exit once its queued tasks are done."""
        h.retiring = True
        h.send_exit()

    def reap(self, h: WorkerHandle) -> None:
        """Forget a retired worker that has exited."""
        with self._lock:
            if not self._closed:
                self._dispose(h, grace_s=1.0)

    def shutdown(self, grace_s: float = 0.5) -> None:
        """Stop every worker (idempotent). See NOTE [headrace shutdown].

        Called in one of its own worker threads (when the garbage collector finalised an epoch
        there), it waits for none: the others may be waiting for the scheduler lock that thread
        holds; they exit on their own once their queues are closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self.workers.values())
            self.workers.clear()
        here = current_run()
        inside = here is not None and any(h.process is here for h in handles)
        for h in handles:
            h.send_exit(now=True)
        deadline = time.monotonic() + (0.0 if inside else grace_s)
        for h in handles:
            self._dispose(h, max(0.0, deadline - time.monotonic()), quiet=inside)
        _live_pools.discard(self)

    def _dispose(self, h: WorkerHandle, grace_s: float, quiet: bool = False) -> None:
        """Stop one worker and close its pipes; ``quiet``: a worker thread is given up on
        without a warning (see ``shutdown``)."""
        if self.workers.get(h.slot) is h:
            del self.workers[h.slot]
        p = h.process
        if getattr(p, "_closed", False):
            return  # disposed already
        if grace_s > 0:
            p.join(grace_s)
        if quiet and h.is_thread and p.is_alive():
            p.give_up()
        if p.is_alive():
            p.terminate()
            p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join()
        for close in (h.conn.close, h.tasks.close):
            try:
                close()
            except (OSError, ValueError):
                pass
        if h.ring is not None:  # the worker is gone and its pipe closed: nothing reads it now
            h.ring.close()
        try:
            p.close()
        except ValueError:
            pass


_live_pools: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
_exit_lock = threading.Lock()


@atexit.register
def _shutdown_all_pools() -> None:
    """Interpreter exit: stop whatever pools are still alive (see NOTE [headrace shutdown])."""
    with _exit_lock:
        for pool in list(_live_pools):
            pool.shutdown(grace_s=0.2)
