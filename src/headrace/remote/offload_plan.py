"""FastFlow's smart offloading, measured and applied: ``headrace.remote.plan_offload``.

The policy is ``planner/offload.py``; this module measures its inputs on the user's own job:

1. Lthp and Gthp with ``profiler.probe`` on local workers only (remote target 0), the user's
   ``train_step`` included (FastFlow §5.1), converted to samples/s, the local workers
   that ran it (with ``num_workers="auto"``, the count the scaler had reached when the probe
   ended, not the one its pool started with) and the most the loader may run
   (``local_counts``);
2. the per-step CPU seconds and output bytes from the loader's profile (measured meanwhile);
3. the link: bandwidth to a remote worker's node and the local CPU of receiving a sample
   (``remote/link.py``, a few hundred milliseconds; parameters override it);
4. Rthp: a short run with every remote worker the cluster holds now, once they are placed,
   counting the samples they finish per second while the loader is input-bound;

then decides and applies the decision (``RemoteSession.apply_offload``), and leaves a watcher
that decides again when the cluster, the profile or the throughput changes
(``remote/replan.py``).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from headrace.planner.offload import (
    OffloadDecision,
    decide,
    inputs_from_profile,
    local_bound,
    worker_rate,
)
from headrace.planner.replan import ReplanConfig
from headrace.planner.workers import rank_cpus
from headrace.profiler.probe import ProbeResult, probe
from headrace.profiler.report import PipelineProfile, cpu_share
from headrace.remote.replan import OffloadWatcher

READY_TIMEOUT_S = 120.0
"""Longest the remote probe waits for its workers to be placed (seconds)."""


def plan_offload(loader: Any, train_step: Any, batches: int = 20, warmup: int = 3,
                 bandwidth: float | None = None, overhead_s: float | None = None,
                 remote_batches: int | None = None, replan: ReplanConfig | bool = True
                 ) -> tuple[OffloadDecision, ProbeResult]:
    """Measure, decide and apply FastFlow's offloading for ``loader`` (which has
    ``Options(remote=...)``).

    ``bandwidth``: bytes/s between remote nodes and this host; ``overhead_s``: local CPU
    seconds an offloaded sample costs here. ``None`` (default): measured by a short probe
    (``remote/link.py``; ``inf`` and 0 when no remote worker can be placed); a number
    overrides the measurement. ``remote_batches``: batches timed for Rthp (default
    ``batches``; 0: skip, trust the profile's CPU times). ``replan``: keep watching and decide
    again when the cluster, the profile or the measured throughput changes
    (``remote/replan.py``; a ``ReplanConfig`` sets the thresholds; ``False``: decide once).
    Returns the decision (also shown by ``loader.explain()``) and the local probe."""
    session = loader.remote
    if session is None:
        raise ValueError("plan_offload needs a loader with Options(remote=headrace.Remote(...))")
    session.open(may_join=True)  # no remote worker placeable now: none decided, watched
    session.watcher = None  # a new plan replaces the watched one
    saved = session.target
    session.target = 0  # Lthp: local workers only
    try:
        local = probe(loader, train_step, batches=batches, warmup=warmup)
    finally:
        session.target = saved
    bs = loader.batch_size or 1
    profile = loader.planning.profile() if loader.planning is not None else None
    if profile is None or not profile.samples:
        raise ValueError("plan_offload: no sample was profiled (Options(profile=False)?)")
    available = session.capacity()
    link = None
    if available > 0 and (bandwidth is None or overhead_s is None):
        from headrace.remote import ray_backend

        link = ray_backend.probe_link(session.cfg)
    session.link = link
    out_bytes = profile.steps[-1].bytes_out_mean if profile.steps else 0.0
    if bandwidth is None:
        bandwidth = link.bandwidth if link is not None else math.inf
    if overhead_s is None:
        overhead_s = link.overhead_s(out_bytes) if link is not None else 0.0
    remote_thp = None
    n = batches if remote_batches is None else remote_batches
    if available > 0 and n > 0 and local.input_bound:
        remote_thp = _remote_throughput(loader, train_step, n, available)
    ran, most = loader_local_workers(loader, profile)
    x = inputs_from_profile(profile, gthp=local.gthp * bs, lthp=local.lthp * bs,
                            remote_workers=available, bandwidth=bandwidth,
                            overhead_s=overhead_s, remote_thp=remote_thp,
                            read_source=session.cfg.read_source,
                            local_workers=ran, local_max=most)
    decision = decide(x)
    per_worker = worker_rate(x, decision)
    session.apply_offload(decision, per_worker, available=available)
    if replan is not False and not session.cfg.autoplace:
        cfg = replan if isinstance(replan, ReplanConfig) else None
        planning, monitor = loader.planning, loader.monitor
        session.watcher = OffloadWatcher(session, x, decision, planning.profile,
                                         lambda: monitor.epochs, cfg, loader.autoscale)
    return decision, local


def local_counts(started: int, reached: int | None, bound: int | None, cores: float,
                 share: float | None, memory_cap: int | None = None) -> tuple[int, int]:
    """(ran, most): the local workers that ran the probe and the most the loader may run that
    add throughput (``planner.offload.local_bound``). ``started``: the count its pool started
    with (or ``num_workers``); ``reached``: with ``num_workers="auto"``, the count the worker
    scaler had reached when the probe ended (``None``: a fixed count, or no decision yet);
    ``bound``: the scaler's upper bound (``None``: a fixed count, none more may start);
    ``cores``: the cores the workers may use; ``share``: a sample's CPU ÷ wall seconds;
    ``memory_cap``: the workers the scaler's memory budget allows (``None``: not measured),
    which the scaler never passes: the estimate took the cores' count where memory allowed
    fewer, and offloaded less than the job needed."""
    ran = max(1, reached if reached is not None else started)
    if bound is None:
        return ran, ran
    most = local_bound(bound, cores, share)
    if memory_cap is not None:
        most = min(most, memory_cap)
    return ran, max(ran, most)


def loader_local_workers(loader: Any, profile: PipelineProfile) -> tuple[int, int]:
    """``local_counts`` of ``loader`` after its probe: with ``num_workers="auto"`` the scaler's
    last count (``Monitor.last_workers``), its upper bound for the profile's CPU share and the
    workers its memory budget allows (``WorkerScaling.memory_cap``)."""
    started = loader.remote.local_started or int(loader.num_workers)
    if not loader.autoscale:
        return local_counts(started, None, None, rank_cpus(), None)
    share = cpu_share(profile.steps)
    return local_counts(started, loader.monitor.last_workers(started),
                        loader.options.autoscale.bounds(share)[1], rank_cpus(), share,
                        loader.monitor.memory_cap())


def _remote_throughput(loader: Any, train_step: Any, batches: int, workers: int
                       ) -> float | None:
    """Samples/s ``workers`` remote workers finish while every worker is busy (None: they
    were not all placed within ``READY_TIMEOUT_S``)."""
    session = loader.remote
    saved = session.target
    session.target = workers
    it = iter(loader)
    try:
        tick = threading.Event()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while sum(w.ready for w in list(it.pool.workers.values()) if w.external) < workers:
            if time.monotonic() > deadline:
                return None
            tick.wait(0.05)
        r0, t0 = session.remote_samples, time.perf_counter()
        for _ in range(batches):
            try:
                train_step(next(it))
            except StopIteration:
                break
        wall = time.perf_counter() - t0
        done = session.remote_samples - r0
        return done / wall if wall > 0 and done > 0 else None
    finally:
        session.target = saved
        it.close()
