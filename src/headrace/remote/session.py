"""A loader's remote workers: joining the cluster, starting them in a pool, counting them.

Imports no Ray itself: ``remote/ray_backend.py`` is imported when ``open()`` is first called,
that is when a loader with ``Options(remote=Remote(...))`` starts its first epoch.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from headrace.errors import PipelineError, RemoteUnavailableError
from headrace.remote.config import Remote, check_read_source
from headrace.remote.counts import RemoteCounts
from headrace.remote.proxy_options import LoadDraws, ProxyOptions
from headrace.remote.replacing import Replacements
from headrace.remote.starts import ENDED_FIRST, FirstResult, StartFailures
from headrace.remote.storage import NearStorage, StorageSide
from headrace.runtime.handles import WorkerHandle
from headrace.runtime.pool import WorkerPool
from headrace.runtime.threadworker import ThreadResults, ThreadRun
from headrace.runtime.work import Fatal
from headrace.runtime.worker import WorkerSetup

log = logging.getLogger("headrace")

class RemoteSession(RemoteCounts):
    """The remote side of one loader.

    ``target``: remote workers wanted now (set by the placement controller, or
    ``Remote.workers`` / ``max_workers``); ``starts``: those that never started, and why
    (``remote/starts.py``); ``remote_samples``, ``lost`` and the other counts:
    ``remote/counts.py``.
    """

    def __init__(self, cfg: Remote) -> None:
        super().__init__()
        self.cfg = cfg
        self.available = False
        self.error: str | None = None
        """Why the cluster is not used (``Remote(required=False)`` and it was unreachable)."""
        self.max_workers = 0
        self.target = 0
        self.starts = StartFailures()
        self.stop: int | None = None
        """Remote part ends before this step (the offload split; None: the whole sample)."""
        self._opened = False
        """The cluster was joined, or found unreachable (``remote/joining.py``)."""
        self.offload: Any = None
        self.ratio = 1.0
        """Share of samples remote workers may finish (the offload ratio; 1: no limit)."""
        self._counters: Any = None  # the running epoch's scheduler counters
        self._epoch_base = 0  # remote_samples when that epoch started
        """The last FastFlow decision applied (``apply_offload``), for ``explain()``."""
        self.read_local: bool = not cfg.read_source
        """This host reads samples for the remote workers (the source is not reachable there)."""
        self.placement: Any = None
        """The AutoPlacement controller (``remote/autoplace.py``) once running."""
        self.link: Any = None
        """What ``plan_offload``'s link probe measured (``remote/link.py``), or None."""
        self.local_started: int | None = None
        """Local workers the latest pool started with (``num_workers``), once ``attach`` ran."""
        self.watcher: Any = None
        """Makes the offloading decision again when it goes stale (``remote/replan.py``; armed
        by ``plan_offload``)."""
        self.replacements = Replacements()
        """Remote workers that ended, and when to start one in place of each."""
        self._lock = threading.Lock()
        self._add_lock = threading.Lock()
        self._changes = threading.Condition()  # wait_ready's wake-up
        self._pool_opts: tuple[Any, Any] = (lambda: None, None)  # (weakref to pool, options)
        self.near: Any = None
        """Near storage (``remote/storage.py``'s ``StorageSide``), once a pool exists."""
        self.placed_total = 0
        """Remote workers Ray placed and ran since the loader started."""
        self.unplaced: str | None = None
        """Why no remote worker could be placed when the cluster was joined with ``may_join``
        (``config.unplaceable``), for ``explain()``."""
        self.cache_on = False
        """The latest pool's local workers use a sample cache (remote workers never do)."""
        self.load_draws = LoadDraws()
        """The proxies' loads seen drawing from a global generator, and whether they stopped
        loading: for the loader's life, shared by its pools' ``ProxyOptions``."""

    # -- cluster -------------------------------------------------------------------------------
    def open(self, may_join: bool = False) -> int:
        """Join the cluster once; the number of remote worker slots to reserve (0: none).
        ``remote/joining.py`` says how (a worker no live node can hold now, an unreachable
        cluster)."""
        from headrace.remote.joining import join

        return join(self, may_join)

    # -- workers -------------------------------------------------------------------------------
    def remote_workers(self, pool: WorkerPool) -> list[WorkerHandle]:
        """This pool's remote workers (not being retired)."""
        return [w for w in list(pool.workers.values()) if w.external and not w.retiring]

    def attach(self, pool: WorkerPool, on_added: Any = None) -> None:
        """Start remote workers in ``pool`` up to ``target``; a new pool also gets the local
        worker count AutoPlacement had reached (``PlacementController.adopt``)."""
        if not self.available or self.starts.gave_up:
            return
        self.local_started = sum(not w.external for w in list(pool.workers.values()))
        if self.placement is not None:
            self.placement.adopt(pool)
        while len(self.remote_workers(pool)) < self.target:  # add: None once the pool is full
            if self.add(pool) is None:
                return
            if on_added is not None:
                on_added()

    def add(self, pool: WorkerPool) -> WorkerHandle | None:
        """Start one remote worker in ``pool`` (None once the pool is closed or full). Called
        by the training thread (``attach``) and the scheduler thread (``on_tick``): one at a
        time."""
        if self.starts.gave_up or self._idle_for_good():
            return None  # starts.limit in a row failed: no more (on_tick says what follows)
        with self._add_lock:  # None when every remote slot is taken (retiring ones too)
            added = pool.add_worker(start=lambda setup: self._start(pool, setup))
        self._changed()  # in the pool now: it may be placed already
        return added

    def retire(self, pool: WorkerPool) -> bool:
        """Retire the remote worker holding the fewest samples (False: none left)."""
        live = self.remote_workers(pool)
        if not live:
            return False
        pool.retire(min(live, key=lambda w: len(w.assigned)))
        return True

    def _options(self, pool: WorkerPool) -> ProxyOptions:
        with self._lock:
            ref, opts = self._pool_opts
            if ref() is not pool:
                steps = len(pool.pipeline.step_names)
                opts = ProxyOptions(
                    self.cfg, pool.pipeline, steps,
                    processes=pool.executor != "threads", on_lost=self._lost_in,
                    on_resumed=self._resumed,
                    on_started=self._started,
                    on_start_failed=self._start_failed,
                    on_loaded_again=self._loaded_again, draws=self.load_draws)
                opts.handoff = pool.handoff
                self._pool_opts = (weakref.ref(pool), opts)
            self.cache_on = getattr(pool.cache, "enabled", False)
            opts.stop = self.stop if self.stop is not None else opts.steps
            opts.read_local = self.read_local
            opts.stops = self.near
            return opts

    def facts(self, pool: WorkerPool | None, steps: list[str], measured_thp: float | None
              ) -> Any:
        """What ``explain()`` says about the remote side (``remote/facts.py``)."""
        from headrace.remote.facts import remote_facts

        return remote_facts(self, pool, steps, measured_thp)

    @property
    def near_storage(self) -> bool:
        """The workers are near-storage fetchers (``hr.NearStorage``)."""
        return isinstance(self.cfg, NearStorage)

    def prepare(self, pipeline: Any, local_workers: int, profile: bool | str) -> bool | str:
        """Before a pool starts (after ``open``): the near-storage controller, once, and the
        pool's ``profile`` (near storage measures every sample's sizes: ``"all"``).

        Raises ``PipelineError`` where ``Remote(read_source=False)`` has nothing to ship
        (``config.check_read_source``)."""
        if not self.near_storage:
            check_read_source(self.cfg, pipeline.step_names, pipeline.embedded)
        if not self.near_storage or not self.available:
            return profile
        if self.near is None:
            assert isinstance(self.cfg, NearStorage)
            if pipeline.length() is None:
                raise PipelineError("NearStorage keeps each sample's sizes by index: it needs a "
                                    "dataset with __len__")
            self.near = StorageSide(self.cfg, pipeline.length(), pipeline.step_names,
                                    max(1, local_workers))
            self.near.storage_workers = max(1, self.target)
        return "all" if profile else profile

    def _near_sample(self, index: int, step_s: float | None, slow: bool, timings: Any) -> None:
        if self.near is not None:
            self.near.on_sample(index, step_s, slow, timings)

    def _near_epoch(self, monitor: Any) -> None:
        if self.near is not None and monitor is not None and monitor.epochs:
            # storage cores of the next decision: the storage workers running now
            self.near.storage_workers = max(1, self.ready_workers() or self.target)
            self.near.on_epoch_closed(monitor.epochs[-1].wall_s)

    def ready_workers(self) -> int:
        """Remote workers of the latest pool whose actor is placed and running (between
        epochs of persistent workers too, before a scheduler has seen their ``ready``)."""
        pool, opts = self._pool_opts[0](), self._pool_opts[1]
        if pool is None or pool.closed or opts is None:
            return 0
        placed = dict(opts.placed)
        return sum(w.slot in placed for w in self.remote_workers(pool))

    def wait_ready(self, n: int, timeout_s: float = 120.0) -> bool:
        """Wait (bounded, ``timeout_s`` seconds) until ``n`` remote workers of the latest pool
        are ready (benchmarks: start-up kept out of the timed epoch). False on timeout.
        Woken when an actor is placed or a worker joins the pool (``_changed``), the two
        events that can make ``ready_workers`` grow; it polled every 50 ms."""
        with self._changes:
            return self._changes.wait_for(lambda: self.ready_workers() >= n, timeout_s)

    def _changed(self) -> None:
        """Wake ``wait_ready``: a remote worker was placed, added, or ended."""
        with self._changes:
            self._changes.notify_all()

    def nodes(self) -> dict[int, str]:
        """Slot -> Ray node id of each remote worker placed so far (the latest pool's)."""
        opts = self._pool_opts[1]
        return dict(opts.placed) if opts is not None else {}

    def _started(self, slot: int) -> None:
        """A remote worker's actor was placed and runs (a proxy thread says); it has started
        once it returns a result (``starts.FirstResult``)."""
        self.starts.placed(slot)
        self.placed_total += 1
        self._changed()

    def _lost_in(self, slot: int) -> None:
        """The remote worker in ``slot`` was lost after Ray placed it (a proxy thread says);
        lost before its first result, it also counts as a start that failed
        (``remote/starts.py``)."""
        self.replacements.ended(slot)
        self._lost()
        if self.starts.lost(slot) and self.starts.report(
                slot, ENDED_FIRST, self.cfg.address, self.cfg.required, placed=True):
            self.target = 0  # gave up: no more are started

    def _start_failed(self, slot: int, cause: str) -> None:
        """A remote worker died before it ran (a proxy thread says)."""
        self.replacements.ended(slot)
        if self.starts.report(slot, cause, self.cfg.address, self.cfg.required):
            self.target = 0  # gave up: no more are started

    def _start(self, pool: WorkerPool, setup: WorkerSetup) -> WorkerHandle:
        from headrace.remote import ray_backend

        self.replacements.started(setup.slot)
        tasks, results = ray_backend.RemoteTasks(), ThreadResults()
        opts = self._options(pool)
        outcomes = FirstResult(self._took, setup.slot, self.starts)
        # get_worker_info().num_workers: every slot, local and remote, so that each worker's
        # id (its slot, after the local ones) is below it, as torch's (docs/design.md)
        setup = setup._replace(num_workers=pool.max_slots)
        run = ThreadRun(ray_backend.proxy_main,
                        (setup, tasks, results, pool.progress, opts, outcomes),
                        name=f"headrace-worker-remote-{setup.slot}")
        run.start()
        return WorkerHandle(setup.slot, run, tasks, results, None, external=True,
                            gate=self._may_take, prefers_slow=self.cfg.slow_lane,
                            fetches=self.near_storage, runs=opts.runs, took=outcomes.took)

    def _may_take(self) -> bool:
        """May remote workers take more samples now (the scheduler asks before dispatching)?
        Not once their proxies load no more (``LoadDraws.stopped``) while the remote part
        starts at the load (``read_local``): every sample they took would go back to the
        local workers unloaded, a round trip for nothing (and ``on_tick`` retires them). Else
        the offload ratio (``_within_ratio``)."""
        if self._idle_for_good():
            return False
        return self._within_ratio()

    def _idle_for_good(self) -> bool:
        """Remote workers would take no sample for the rest of the loader's life: their
        proxies load no more (``LoadDraws.stopped``, for the loader's life) and the remote
        part starts at the load (``read_local``; a replan moving it past the load, the actor
        reading the source, ends this). The dispatcher offers a worker fresh samples whenever
        it takes any (``WorkerHandle.runs`` is asked of retries and slow-lane samples only),
        so they would take no slow-lane sample either (docs/design.md): none is started, and
        ``on_tick`` retires those running, which gives their CPUs back to the cluster."""
        return self.read_local and self.load_draws.stopped

    def _within_ratio(self) -> bool:
        """May remote workers take more samples now? FastFlow's ApplyOffRatio by counters:
        samples offloaded this epoch (held by a remote worker, or their remote part done,
        also when local workers finish them after the split) stay within ``ratio`` of all
        finished ones (plus one per remote worker, so they can start). The scheduler asks
        before dispatching."""
        c, pool = self._counters, self._pool_opts[0]()
        if self.ratio >= 1.0 or c is None or pool is None:
            return True
        held = sum(len(w.assigned) for w in self.remote_workers(pool))
        remote = self.remote_samples - self._epoch_base + held
        return remote < self.ratio * (c.fast + c.slow + held) + self.target

    def apply_offload(self, decision: Any, per_worker_thp: float | None = None,
                      available: int | None = None) -> None:
        """Apply a FastFlow decision (``planner/offload.py``): the remote range's end becomes
        the split point, its start says who reads the source (this host, whatever it says,
        with ``Remote(read_source=False)``), and the remote worker count
        follows the ratio (``workers_needed``; all available workers when one worker's rate is
        unknown; none when offloading does not pay). ``available``: remote workers the cluster
        holds now (default ``max_workers``). New samples follow it at once; the worker count
        from the next epoch on, or at once through ``remote/replan.py``."""
        self.offload = decision
        if not decision.offload:
            self.target = 0
            return
        self.ratio = decision.ratio
        best = decision.best
        self.stop = best.stop
        self.read_local = best.start > 0 or not self.cfg.read_source
        room = self.max_workers if available is None else min(available, self.max_workers)
        rate = per_worker_thp or (decision.best.rthp / max(1, room))
        self.target = decision.workers_needed(rate, room)
        opts = self._pool_opts[1]
        if opts is not None:  # the running pool's proxies read these for every new sample
            opts.stop, opts.read_local = self.stop, self.read_local

    def capacity(self) -> int:
        """Remote workers the cluster can hold now, at most ``max_workers`` (0: not joined)."""
        if not self.available:
            return 0
        from headrace.remote import ray_backend

        return min(self.max_workers, ray_backend.capacity(self.cfg))

    def on_tick_scheduler(self, sched: Any) -> None:
        """Every scheduler pass: replace dead remote workers; run AutoPlacement."""
        if sched.counters is not self._counters:  # a new epoch: the ratio counts from here
            self._counters, self._epoch_base = sched.counters, self.remote_samples
        self.forget_settled(sched.lanes.recs)
        self.on_tick(sched.pool)
        if self.watcher is not None:
            self.watcher.on_tick(sched)
        if self.cfg.autoplace and self.available:
            from headrace.remote.autoplace import placement_tick

            placement_tick(self, sched)

    def on_tick(self, pool: WorkerPool) -> None:
        """Replace remote workers that died, up to ``target`` (Ray places them on live nodes),
        at most one every ``REPLACE_EVERY_S``, once the scheduler has handled the end
        (``remote/replacing.py``), none once ``starts.limit`` in a row failed to start: then
        ``Remote(required=True)`` ends the epoch with the cause. Retire them all once they
        would idle for good (``_idle_for_good``)."""
        if not self.available or pool.closed:
            return
        if self.starts.gave_up:  # required=True: an error once no remote worker runs at all
            if self.cfg.required and not any(w.ready for w in self.remote_workers(pool)):
                raise Fatal(RemoteUnavailableError(self.starts.message(self.cfg.address)))
            return
        live = self.remote_workers(pool)
        if live and self._idle_for_good():
            log.warning("headrace: retiring the %d remote workers: their proxies load no "
                        "more samples and every sample's remote part starts at the load, so "
                        "they would idle for the loader's life, holding %g CPUs each on the "
                        "Ray cluster; none is started again unless the offload is decided "
                        "again with the remote part past the load", len(live),
                        self.cfg.num_cpus)
            for w in live:
                pool.retire(w)
            return
        if not self.replacements.due(self.lost + self.starts.total, [w.slot for w in live],
                                     time.monotonic()):
            return
        if len(live) < self.target:
            self.add(pool)


def remote_session(cfg: Remote | None, monitor: Any) -> RemoteSession | None:
    """The loader's remote session (None without ``Options(remote=...)``), ticked by the
    scheduler through ``monitor.tick_listeners``. Joins no cluster yet (see ``open``)."""
    if cfg is None:
        return None
    if isinstance(cfg, NearStorage):
        cfg = cfg.placed()
    session = RemoteSession(cfg)
    monitor.tick_listeners.append(session.on_tick_scheduler)
    if session.near_storage:
        monitor.sample_listeners.append(session._near_sample)
        ref = weakref.ref(monitor)
        monitor.epoch_listeners.append(lambda: session._near_epoch(ref()))
    return session
