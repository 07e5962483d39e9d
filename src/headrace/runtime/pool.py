"""Worker processes: start, replace and retire them (stopping them: ``runtime/worker_stop.py``,
NOTE [headrace shutdown])."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from headrace.pipeline import Pipeline
from headrace.runtime import kept_said, live_pools, python_draws, worker_stop
from headrace.runtime.forks import StartRequests
from headrace.runtime.handles import HandOff, Progress, WorkerHandle
from headrace.runtime.native_threads import resolved_for_fork
from headrace.runtime.process_start import start_worker_process
from headrace.runtime.threadworker import (
    ThreadResults,
    ThreadRun,
    ThreadTasks,
    thread_main,
)
from headrace.runtime.worker import WorkerSetup

log = logging.getLogger("headrace")

class WorkerPool:
    """A set of worker processes over one pipeline, with per-worker task and result pipes.

    Per-worker pipes (not one shared queue) so that a worker killed by the OS can hold no lock
    another worker needs, and the main process knows exactly which samples it held.
    ``executor="threads"``: the workers are threads of this process behind the same handles
    (``runtime/threadworker.py``).

    Slots: ``max_slots`` in all; the pool's own workers (processes or threads) get slots
    ``0..local_slots-1`` and a backend's (``remote/``) the last ``backend_slots``. A local
    worker's slot is its ``get_worker_info().id`` and its row of the sample cache's shared
    counters (``cache/client.py``: ``local_slots`` rows, then the training process's), so a
    backend's worker never takes one: a local worker that started after remote workers took
    the low slots landed past the counters' rows (every sample it ran failed) or wrote into the
    training process's row.
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
        backend_slots: int = 0,
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
        self.local_slots = max_slots - backend_slots
        """Slots of the pool's own workers (``0..local_slots-1``); a backend's come after."""
        rows = getattr(getattr(cache, "counters", None), "rows", None)
        if rows is not None and rows <= self.local_slots:
            raise ValueError(f"the cache's counters have {rows} rows for {self.local_slots} "
                             "worker slots and the training process")
        self.profile = profile
        self.handoff = HandOff(ctx, len(pipeline.step_names))
        """Shared hand-off timeout and expected remaining step time, read by workers."""
        self.progress = Progress(ctx, max_slots, kept_said.shared(ctx, pipeline))
        """What each worker slot is running (see ``Progress``)."""
        self.python_draws = python_draws.shared(ctx, pipeline)
        """Per step: known to draw from Python's generator (``runtime/python_draws.py``): what
        earlier pools learned, and what this pool's workers flag; each reads it at its start."""
        self.workers: dict[int, WorkerHandle] = {}
        self.tids = itertools.count()
        """Task ids, unique over the pool's life (persistent workers span epochs)."""
        self.requests = StartRequests()
        """Workers the scheduler thread asked for, to fork on the training thread (``forks.py``)."""
        self.failed_slots: set[int] = set()
        """Own slots whose ``worker_init_fn`` (or dataset setup) raised: no worker starts in
        them again until ``start`` (``runtime/starts.py``: persistent workers go on without)."""
        self._dropped: set[int] = set()  # failed slots that drop_failed returned
        self.starting = False
        """``start`` is forking the pool's first workers (a ``worker_init_fn``'s epoch holds
        its first batch until they all started: ``runtime/starts.py``)."""
        self._closed = False
        self._lock = threading.RLock()  # shutdown (atexit, finalizers) races the scheduler thread
        self._owner_pid = os.getpid()  # the process whose workers these are
        self._undisposed: list[WorkerHandle] = []  # what an interrupted shutdown left
        live_pools.sweep_interrupted()  # a new pool (the next iter()): earlier leftovers go
        live_pools.add(self)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size(self) -> int:
        """Workers not being retired."""
        return sum(not w.retiring for w in self.workers.values())

    @property
    def own_workers(self) -> int:
        """The pool's own workers (processes or threads, not a backend's: ``remote/``) not
        being retired, and those asked for and not forked yet (``requests``): the count the
        worker scaler adapts and the next epoch's pool starts from (``num_workers="auto"``).
        ``size`` counts a backend's workers too: recorded as the local count, 1 local worker
        and 2 remote ones started the next epoch at 3 local workers, then 4, with no
        decision of the scaler (a review's find, reproduced on a Ray cluster)."""
        with self._lock:
            own = sum(not w.external and not w.retiring for w in self.workers.values())
            return own + len(self.requests)

    @property
    def full(self) -> bool:
        """Every slot of the pool's own workers is taken, or asked for (``requests``)."""
        return self._own() + len(self.requests) >= self.local_slots

    def _own(self) -> int:
        """Slots the pool's own workers hold (retiring ones included), or that their failed
        start closed (``failed_slots``)."""
        return sum(not w.external for w in self.workers.values()) + \
            len(self.failed_slots - self.workers.keys())

    def _free_slot(self, backend: bool) -> int | None:
        """The lowest free slot of the pool's own workers or of a backend's (None: none); a
        slot in ``failed_slots`` is not free."""
        span = range(self.local_slots, self.max_slots) if backend else range(self.local_slots)
        return next((i for i in span if i not in self.workers and i not in self.failed_slots),
                    None)

    @property
    def forked(self) -> bool:
        """Workers are processes forked from this one: started on the training thread only."""
        return self.executor != "threads" and self.ctx.get_start_method() == "fork"

    def start(self, n: int, on_added: Any = None) -> None:
        """Start ``n`` workers; ``on_added()`` after each (e.g. wake the scheduler thread so it
        watches the new worker's pipe now rather than at its next poll timeout). They are the
        pool's first (or, persistent, replace all that died): starts asked for before are
        dropped, and so are the slots whose start failed (``failed_slots``): each starts again."""
        self.requests.drop()
        self.failed_slots, self._dropped = set(), set()
        forked = self.forked
        if forked:
            # Each worker seeds NumPy's global generator, as torch's do; NumPy 2 imports
            # numpy.random on first use (5 ms alone, 39-117 ms a worker measured on 16 cores
            # while the others fork, the import's writes copying the pages they touch).
            # Imported once here, every forked worker has it.
            import numpy.random  # noqa: F401
        self.starting = True
        try:
            with (resolved_for_fork() if forked and self.blas_threads is not None
                  else contextlib.nullcontext()):
                self._start(n, on_added)
        finally:
            self.starting = False
        if on_added is not None:
            on_added()  # the scheduler hears that they all started (``runtime/starts.py``)

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
        when every slot is taken or asked for (``full``: the scaler, on the scheduler thread,
        may fill them with worker threads while ``start`` still starts its first workers).
        ``start(setup)``: a backend's own kind of worker (``remote/``) instead of the pool's,
        in a backend slot (None when every one is taken)."""
        with self._lock:
            if self._closed:
                return None
            if slot is None:
                if start is None and self.full:
                    return None
                slot = self._free_slot(backend=start is not None)
                if slot is None:
                    return None
            return self._add_worker(slot, num_workers, start)

    def _add_worker(self, slot: int | None, num_workers: int | None,
                    start: Callable[[WorkerSetup], WorkerHandle] | None = None) -> WorkerHandle:
        if slot is None:
            slot = self._free_slot(backend=start is not None)
            assert slot is not None, "no free slot: callers check full first"
        own = sum(not w.external and not w.retiring for w in self.workers.values())
        setup = WorkerSetup(
            slot=slot,
            num_workers=num_workers if num_workers is not None else max(own, slot + 1),
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
        self.progress.clear_revoked(slot)  # a dead predecessor's revocations do not carry over
        if start is None and self.executor != "threads":  # records its handle itself
            return start_worker_process(self.ctx, setup, self.handoff, self.progress,
                                        self.workers, self.python_draws)
        if start is None:
            start = self._start_thread
        h = self.workers[slot] = start(setup)
        return h

    def _start_thread(self, setup: WorkerSetup) -> WorkerHandle:
        tasks, results = ThreadTasks(), ThreadResults()
        run = ThreadRun(thread_main, (setup, tasks, results, self.handoff, self.progress),
                        name=f"headrace-worker-{setup.slot}")
        run.start()
        return WorkerHandle(setup.slot, run, tasks, results, None)

    def request_worker(self, num_workers: int | None = None) -> bool:
        """One more worker, asked for on the scheduler thread (the scaler): started now where
        that forks nothing, else by the training thread (``start_requested``; ``forks.py``).
        False once closed, or when every slot is taken or asked for."""
        with self._lock:
            if self._closed or self.full:
                return False
            if self.forked:
                self.requests.ask(None, num_workers)
            else:
                self._add_worker(None, num_workers)
            return True

    def replace(self, dead: WorkerHandle) -> bool:
        """Discard a dead worker and start a fresh one in its slot, as ``request_worker``
        does; False once closed, or for a backend's worker (its backend decides whether and
        where to start another)."""
        with self._lock:
            if self._closed:
                return False
            self._dispose(dead, grace_s=0.0)
            if dead.external:
                return False
            if self.forked:
                self.requests.ask(dead.slot, None)
            else:
                self._add_worker(dead.slot, None)
            return True

    def start_requested(self, on_added: Any = None) -> None:
        """Fork the workers the scheduler thread asked for (``forks.py``; replacements first,
        then in the order asked) on the training thread (``EpochIterator.take``); ``on_added()``
        after each, as ``start``. Each leaves ``requests`` under the pool's lock as it forks, so
        a start is always counted in one of ``requests`` and ``workers``. A replacement whose
        slot was taken meanwhile takes another; one with no slot of the pool's own free is
        dropped, with a warning."""
        while True:
            with self._lock:
                req = None if self._closed else self.requests.pop()
                if req is None:
                    return
                slot, num_workers = req
                if slot in self.workers:
                    slot = None
                if slot is None and self._free_slot(backend=False) is None:
                    log.warning("headrace: a worker start was dropped: all %d slots are taken",
                                self.local_slots)
                    continue
                self._add_worker(slot, num_workers)
            if on_added is not None:
                on_added()

    def retire(self, h: WorkerHandle) -> None:
        """Ask a worker to exit once its queued tasks are done."""
        h.retiring = True
        h.send_exit()

    def reap(self, h: WorkerHandle) -> None:
        """Forget a retired worker that has exited, or one whose start failed."""
        with self._lock:
            if not self._closed:
                self._dispose(h, grace_s=1.0)

    def drop_failed(self) -> list[int]:
        """Forget the workers whose start failed (``failed_slots``; they exit after saying
        so), not replaced; the failed slots not returned before, lowest first."""
        for w in [w for w in self.workers.values() if w.slot in self.failed_slots]:
            self.reap(w)  # (or a death seen after the failure reaped it already)
        new, self._dropped = self.failed_slots - self._dropped, set(self.failed_slots)
        return sorted(new)

    def shutdown(self, grace_s: float = 0.5) -> None:
        """Stop every worker (idempotent). See NOTE [headrace shutdown].

        Called in one of its own worker threads (when the garbage collector finalised an epoch
        there), it waits for none: the others may be waiting for the scheduler lock that thread
        holds; they exit on their own once their queues are closed."""
        if os.getpid() != self._owner_pid:
            return  # a copy in a process the user's code forked: the workers are not its own
            # (at its exit, the atexit hook and the loader's finaliser stopped the training
            # process's workers: exit messages down the shared pipes)
        with self._lock:
            again = self._closed  # then what an interrupt left undisposed, if anything
            if again:
                handles, self._undisposed = self._undisposed, []
                if not handles:
                    return
            else:
                self._closed = True
                self.requests.drop()
                handles = list(self.workers.values())
                self.workers.clear()
                python_draws.learn(self.pipeline, self.python_draws)  # for the next pools
                kept_said.learn(self.pipeline, self.progress.kept)  # said: not by the next
        worker_stop.stop(handles, grace_s, send_exits=not again, dispose=self._dispose,
                         cut=self._keep_undisposed)
        live_pools.discard(self)

    def _keep_undisposed(self, left: list[WorkerHandle]) -> None:
        """What an interrupted shutdown left, for the next one."""
        with self._lock:
            self._undisposed.extend(left)

    def _dispose(self, h: WorkerHandle, grace_s: float, quiet: bool = False) -> None:
        """Forget one worker, then stop it and close its pipes (``worker_stop.dispose``)."""
        if self.workers.get(h.slot) is h:
            del self.workers[h.slot]
        worker_stop.dispose(h, grace_s, quiet)
