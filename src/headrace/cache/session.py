"""One loader's cache: owns the backend, splits the budget, counts per epoch, explains.

Lives in the training process. ``client()`` gives the picklable ``CacheClient`` that workers
and the ``num_workers=0`` path use in the running epoch; workers that outlive an epoch take
each new epoch's through ``epoch_cache`` (``cache/epoch_client.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import weakref
from collections.abc import Sequence
from typing import Any

from headrace.cache import session_ods, session_plan
from headrace.cache.config import MIN_DEFAULT_BUDGET, Cache, default_budget, redact
from headrace.cache.counters import Counters
from headrace.cache.epoch_client import EpochCache, EpochClient
from headrace.cache.failure_log import FailureLog
from headrace.cache.tiers import TierLayout
from headrace.pipeline.pipeline import Pipeline
from headrace.planner.cache_partition import (
    INF,
    Split,
    consumer_rate,
)
from headrace.profiler.report import PipelineProfile
from headrace.telemetry.stats import CacheStats, EpochStats, keep_latest

log = logging.getLogger("headrace")


def _fresh_job_name() -> str:
    import os
    import socket
    import uuid

    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def default_split(layout: TierLayout, config: Cache) -> dict[str, float]:
    """Shares of the budget per tier before the MDP model has measurements.

    The whole budget goes to the most processed *exact* form (decoded, else encoded): it saves
    the most CPU per cached sample among the forms every epoch can reuse. With
    ``shared_augmented`` the augmented form gets half (all of it when it is the only form).
    A seeded augmented form (not shared) gets nothing: no other epoch can use it.
    """
    exact = [t.name for t in layout.tiers if not (t.seeded and not t.shared)
             and t.name != "augmented"]
    aug = layout.get("augmented")
    shared_aug = aug is not None and aug.shared
    if config.split is not None:
        return {k: v for k, v in config.split.items() if layout.get(k) is not None}
    if shared_aug:
        return {"augmented": 0.5, exact[0]: 0.5} if exact else {"augmented": 1.0}
    return {exact[0]: 1.0} if exact else {}


def open_session(config: Cache, ctx: Any, worker_rows: int,
                 pipeline: Pipeline) -> tuple[CacheSession | None, str | None]:
    """A loader's cache session, or ``None`` and why the cache is off (for ``explain()``).

    Off where it could only cost: a Dataset in the memory cache without ``shared_augmented``
    (its only form, ``__getitem__``'s output, is never reused: nothing would be stored), a
    default budget under ``MIN_DEFAULT_BUDGET``. Off with a warning where it cannot be set up
    (no usable ``/dev/shm`` for its counters): the cache is optional, and torch's loader runs
    there at ``num_workers=0``. ODS changes what a state dict records, so it is never dropped:
    its errors are raised.
    """
    from headrace import units

    if (config.url == "memory" and not config.shared_augmented
            and (pipeline.opaque or pipeline.embedded)):
        return None, ("a Dataset (not a Pipeline): only __getitem__'s output could be cached, "
                      "as its steps run inside it, and it is exact only within one (base seed, "
                      "epoch); Cache(shared_augmented=True) reuses it across epochs")
    budget, limits, fitted = config.budget_bytes, None, ""
    if config.url != "memory":  # a Redis server: its own limit caps the budget
        from headrace.cache.redis_limits import open_budget

        budget, limits, fitted = open_budget(config.url, budget)
    if budget is None:
        budget, why = default_budget()
        if budget < MIN_DEFAULT_BUDGET:
            return None, (f"the default budget would be {units.size(budget)} ({why}), under "
                          f"{units.size(MIN_DEFAULT_BUDGET)}: a cache that small holds a few "
                          "batches and takes shared memory other loaders need; "
                          "Cache(budget_bytes=...) sets one")
    try:
        return CacheSession(config, ctx, worker_rows, budget, limits, fitted), None
    except OSError as e:
        if config.ods:
            raise
        why = f"{type(e).__name__}: {redact(str(e))}"
        log.warning("headrace: the cache is off: it could not be set up (%s)", why)
        return None, f"it could not be set up ({why})"


class CacheSession:
    """The cache of one loader (``Options(cache=...)``, made by :func:`open_session`);
    ``budget``: its bytes, all tiers together; ``limits``: a Redis server's
    (``redis_limits.ServerLimits``, read at open; None: memory); ``fitted``: how they set the
    budget, in words ("": they did not)."""

    def __init__(self, config: Cache, ctx: Any, worker_rows: int, budget: int,
                 limits: Any = None, fitted: str = "") -> None:
        self.config = config
        self.budget = budget
        self.limits, self.fitted = limits, fitted
        self.counters = Counters(ctx, worker_rows + 1)
        self.epoch_cache = EpochCache(ctx)
        """Each epoch's plan as workers that outlive an epoch read it (``epoch_client.py``)."""
        self._client: EpochClient | None = None
        self.row = worker_rows
        """Counter row of the training process (``num_workers=0``)."""
        self.backend: Any = None
        self.layout: TierLayout | None = None
        self.step_names: list[str] = []
        """The executed steps as ``explain()`` names them, by position (load first)."""
        self._warned: set[str] = set()  # forms found to differ that a warning named
        self.failures = FailureLog(self.counters)
        """Logs the first backend failure, once per loader (``cache/failure_log.py``)."""
        self.split: dict[str, float] = {}
        self.closed_epochs: list[CacheStats] = []
        self.dropped = False  # the loader went on without it (``drop``)
        self.epoch_numbers: list[int] = []
        self._epoch_start: dict[str, int] = self.counters.totals()
        self._finalizer: Any = None
        self._main_uses = False
        self._b_cache: float | None = None
        self.b_cache_how = ""
        """How the plan's B_cache was had, in words (``cache_bandwidth``)."""
        self.plan_off: str | None = None
        """Why MDP did not plan this epoch although a profile exists (None: it did, or no
        profile yet)."""
        self.plan: tuple[Split, list[Split]] | None = None
        """MDP's choice for the running epoch and the single-form splits' predictions."""
        self.plan_best: Split | None = None
        """MDP's best split where the running epoch kept the last one instead (``kept_split``)."""
        self.predicted: list[float | None] = []
        """MDP's predicted samples/s for each epoch started (None: no model yet)."""
        self.active: tuple[str, ...] = ()
        self.job = config.job or _fresh_job_name()
        """This job's name among the jobs sharing a Redis cache (``Cache.job``)."""
        self.ods_off: str | None = None if config.ods else "not asked for (Cache(ods=False))"
        """Why ODS is off (``None``: on); set by the loader from its sampler."""
        self.ods_epoch: Any = None
        """The running epoch's ``ods_epoch.OdsEpoch`` (None without ODS)."""
        self._board: Any = None
        self.measured_t_gpu = INF
        """The training loop's rate in the last finished epoch (``consumer_rate``), samples/s."""
        self.plan_t_gpu = INF
        """The T_GPU the running epoch's MDP plan used (samples/s)."""
        self.plan_b_cache = INF
        """The B_cache the running epoch's MDP plan used (bytes/s)."""

    def _release(self) -> None:
        if not self._main_uses and hasattr(self.backend, "close_here"):
            self.backend.close_here()

    def _open_backend(self) -> Any:
        if self.backend is None:
            if self.config.url == "memory":
                from headrace.cache import memory_backend

                path = memory_backend.make_dir()
                self._finalizer = weakref.finalize(self, memory_backend.remove_dir, path,
                                                   os.getpid())
                self.backend = memory_backend.MemoryBackend(path, self.budget,
                                                             self.counters.rows * 2)
            else:
                from headrace.cache.redis_backend import RedisBackend

                lim = self.limits
                self.backend = RedisBackend(self.config.url, self.budget, self.config.redis_ttl_s,
                                            allow_oom=bool(lim and lim.allow_oom),
                                            ledger=lim is None or lim.evicts)
        return self.backend

    def replan(self, executed: Pipeline, profile: PipelineProfile | None, workers: int,
               in_process: bool) -> None:
        """Choose this epoch's forms and budget split (MDP once a profile of ``executed``
        exists, else ``default_split``) and apply it to the backend.

        ``in_process``: samples run in this process (``num_workers=0``), which then keeps the
        backend open; otherwise it is closed here before workers fork (see ``memory_backend``).
        """
        self._main_uses = in_process
        # keyed anew at every epoch's plan: a source the script changes between epochs (a
        # curriculum's size) gets other entries, never the last epoch's
        layout = TierLayout.for_pipeline(executed, self.config.shared_augmented)
        last = session_plan.last_split(self, layout)
        self.layout = layout
        self.step_names = (["the dataset's __getitem__"] if executed.opaque or executed.embedded
                           else ["the source's load",
                                 *(f"step {n!r}" for n in executed.step_names[1:])])
        self.split = default_split(layout, self.config) if self.budget > 0 else {}
        self.plan, self.plan_off, self.plan_best = None, None, None
        forms = tuple(t.name for t in layout.tiers if not (t.seeded and not t.shared))
        if (self.config.split is None and forms and profile is not None and self.budget > 0
                and profile.step_names == executed.step_names):
            session_plan.plan(self, executed, profile, workers, layout, forms, last)
        self.predicted.append(self.plan[0].predicted if self.plan else None)
        budgets = {t.name: int(self.budget * self.split.get(t.name, 0.0)) for t in layout.tiers}
        self.active = tuple(n for n, b in budgets.items() if b > 0)
        backend = self._open_backend()
        if self.ods_off is None:
            session_ods.plan(backend, layout, self.active)
        if self.active:
            backend.set_budgets(budgets)
        self._client = None  # the epoch's, also for the workers of a persistent pool
        self.epoch_cache.publish(self.client(), budgets)
        self._release()

    def start_ods(self, epoch: int, delivered: Any) -> Any:
        """The ``OdsEpoch`` of a starting epoch (``delivered``: indices delivered before, when
        it resumes), or None when ODS is off. With no tier active (no budget) it still runs,
        answering misses, so that delivery is recorded by sample as the state dict says."""
        self.ods_epoch = None
        if self.ods_off is not None:
            return None
        if self._board is None:
            self._board = session_ods.board(self.backend, self.job, self.config.ods_ttl_s)
        self.ods_epoch = session_ods.epoch(self._board, epoch, delivered)
        self._release()
        return self.ods_epoch

    def client(self) -> EpochClient:
        """The client for the forms and keys ``replan`` chose for the running epoch
        (picklable, for workers; the one a persistent pool's workers take at a new epoch:
        ``cache/epoch_client.py``)."""
        assert self.layout is not None, "replan() first"
        if self._client is None:
            self._client = EpochClient(self.layout, self._open_backend(), self.counters,
                                       self.active, self.epoch_cache, self.epoch_cache.number)
        return self._client

    @property
    def t_gpu(self) -> float:
        """MDP's T_GPU, samples/s: ``Cache.t_gpu``, else the training loop's measured rate."""
        return self.config.t_gpu if self.config.t_gpu is not None else self.measured_t_gpu

    def cache_bandwidth(self, nbytes: float = 0.0) -> float:
        """B_cache in bytes/s (``cache/bandwidth.py``): ``Cache.b_cache`` when given, else
        measured once on the backend in use: a timed copy for the memory backend, ``GET``
        round trips of a value of ``nbytes`` (a sample's bytes, within the probe's bounds) on
        a Redis server. ``b_cache_how`` says which, in words. Raises what the server raised."""
        from headrace import units
        from headrace.cache import bandwidth

        if self.config.b_cache is not None:
            self.b_cache_how = "Cache.b_cache"
            return self.config.b_cache
        if self._b_cache is None:
            if self.config.url == "memory":
                self._b_cache = bandwidth.memory_bandwidth()
                self.b_cache_how = (f"a timed {units.size(bandwidth.MEMORY_PROBE_BYTES)} copy "
                                    "in memory")
            else:
                probe = bandwidth.redis_probe(self._open_backend(),
                                              bandwidth.probe_size(nbytes))
                self._b_cache, self.b_cache_how = probe.bytes_per_s, probe.how
        return self._b_cache

    # -- per-epoch numbers ---------------------------------------------------------------------
    def begin_epoch(self) -> None:
        self._epoch_start = self.counters.totals()

    def epoch_listener(self, monitor: Any) -> Any:
        """A ``Monitor.epoch_listeners`` entry that records each closed epoch's numbers. Also
        has ``monitor``'s ticks and samples log a failure while the epoch runs
        (``FailureLog.listen``)."""
        self.failures.listen(monitor)
        ref = weakref.ref(self)

        def closed() -> None:
            me = ref()
            if me is not None and monitor.epochs and not me.dropped:
                last = monitor.epochs[-1]
                if last.finished:
                    me.measured_t_gpu = consumer_rate(last.samples, last.wall_s, last.stall_s)
                me.end_epoch(last.epoch)

        return closed

    def attach(self, epochs: tuple[EpochStats, ...]) -> tuple[EpochStats, ...]:
        """``epochs`` (the monitor's closed ones, in order) with their cache numbers."""
        n = len(self.closed_epochs)
        return tuple(dataclasses.replace(e, cache=c)
                     for e, c in zip(epochs[:n], self.closed_epochs, strict=True)) + epochs[n:]

    def end_epoch(self, epoch: int) -> None:
        self.warn_failed()
        self.warn_differs()
        self.closed_epochs.append(self.current())
        self.epoch_numbers.append(epoch)
        for history in (self.closed_epochs, self.epoch_numbers, self.predicted):
            keep_latest(history)  # as the monitor's epochs, so the three stay aligned with them

    def current(self) -> CacheStats:
        """What the cache did since the running epoch began."""
        now = self.counters.totals()
        d = {k: now[k] - self._epoch_start.get(k, 0) for k in now}
        by_tier = {t: d[f"hit_{t}"] for t in ("encoded", "decoded", "augmented")
                   if self.layout is None or self.layout.get(t) is not None}
        used, budgets = {}, {}
        if self.backend is not None and self.layout is not None and self.active:
            try:
                used = self.backend.usage()
                budgets = {t.name: self.backend.budget(t.name) for t in self.layout.tiers}
                self._release()
            except Exception:  # noqa: BLE001 - stats must not fail on a broken backend
                pass
        ods = self.ods_epoch
        return CacheStats(
            lookups=d["lookups"], hits=sum(by_tier.values()), hits_by_tier=by_tier,
            inserts=d["inserts"], uncacheable=d["uncacheable"], full=d["full"],
            errors=d["errors"] + (ods.board.errors - ods.errors0 if ods else 0),
            not_worth=d["not_worth"], not_stored=d["not_stored"], drew=d["drew"],
            bytes_by_tier=used,
            budget_by_tier=budgets,
            substituted=ods.substituted if ods else 0, jobs=ods.board.jobs if ods else 0,
        )

    def warn_failed(self) -> None:
        """Log once per loader, from the training process, the first backend failure a worker
        or this process kept (``Counters.note_failure``; ``cache/failure_log.py``): at the end
        of each epoch, and at each tick and every few samples while it runs
        (``epoch_listener``)."""
        self.failures.warn()

    def warn_differs(self) -> None:
        """Warn once per form found to differ from what its steps compute (a worker's check,
        ``cache/verify.py``), from the training process, at the end of the epoch."""
        from headrace.cache.session_explain import differs_lines

        for tier, line in differs_lines(self):
            if tier not in self._warned:
                self._warned.add(tier)
                log.warning("headrace: %s", line)

    def explain_lines(self, opaque: bool, epochs: Sequence[EpochStats] = ()) -> list[str]:
        """What ``explain()`` says of the cache (``cache/session_explain.py``)."""
        from headrace.cache.session_explain import explain_lines

        return explain_lines(self, opaque, epochs)

    def drop(self) -> None:
        """Close for good, in the middle of a run (the loader goes on without a cache): the
        epochs recorded so far stay (``attach``), no later one is recorded."""
        self.dropped = True
        self.close()

    def close(self) -> None:
        """Remove the memory backend's files (a later epoch starts an empty cache); leave the
        ODS group (a killed job expires instead)."""
        if self._board is not None:
            self._board.leave()
            self._board = None
        self._client = self.epoch_cache.current = None
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
            self.backend = None
