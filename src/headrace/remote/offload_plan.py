"""FastFlow's smart offloading, measured and applied: ``headrace.remote.plan_offload``.

The policy is ``planner/offload.py``; this module measures its inputs on the user's own job:

1. Lthp and Gthp with ``profiler.probe`` on local workers only (remote target 0), the user's
   ``train_step`` included (FastFlow §5.1), converted to samples/s;
2. the per-step CPU seconds and output bytes from the loader's profile (measured meanwhile);
3. Rthp: a short run with every remote worker, once they are placed, counting the samples
   they finish per second while the loader is input-bound (all workers busy);

then decides and applies the decision from the next epoch on (``RemoteSession.apply_offload``).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from headrace.planner.offload import OffloadDecision, decide, inputs_from_profile
from headrace.profiler.probe import ProbeResult, probe

READY_TIMEOUT_S = 120.0
"""Longest the remote probe waits for its workers to be placed (seconds)."""


def plan_offload(loader: Any, train_step: Any, batches: int = 20, warmup: int = 3,
                 bandwidth: float = math.inf, overhead_s: float = 0.0,
                 remote_batches: int | None = None) -> tuple[OffloadDecision, ProbeResult]:
    """Measure, decide and apply FastFlow's offloading for ``loader`` (which has
    ``Options(remote=...)``). ``bandwidth``: bytes/s between remote nodes and this host
    (``inf``: not a limit); ``overhead_s``: local CPU seconds an offloaded sample costs here.
    ``remote_batches``: batches timed for Rthp (default ``batches``; 0: skip, trust the
    profile's CPU times). Returns the decision (also shown by ``loader.explain()``) and the
    local probe."""
    session = loader.remote
    if session is None:
        raise ValueError("plan_offload needs a loader with Options(remote=headrace.Remote(...))")
    session.open()
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
    remote_thp = None
    n = batches if remote_batches is None else remote_batches
    if session.available and session.max_workers > 0 and n > 0 and local.input_bound:
        remote_thp = _remote_throughput(loader, train_step, n)
    x = inputs_from_profile(profile, gthp=local.gthp * bs, lthp=local.lthp * bs,
                            remote_workers=session.max_workers if session.available else 0,
                            bandwidth=bandwidth, overhead_s=overhead_s, remote_thp=remote_thp)
    decision = decide(x)
    per_worker = remote_thp / session.max_workers if remote_thp else None
    session.apply_offload(decision, per_worker)
    return decision, local


def _remote_throughput(loader: Any, train_step: Any, batches: int) -> float | None:
    """Samples/s the remote workers finish while every worker is busy (None: none placed)."""
    session = loader.remote
    saved = session.target
    session.target = session.max_workers
    it = iter(loader)
    try:
        tick = threading.Event()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while sum(w.ready for w in list(it.pool.workers.values()) if w.external) \
                < session.max_workers:
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
