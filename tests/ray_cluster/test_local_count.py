"""``num_workers="auto"`` with remote workers: the worker scaler decides on the local workers,
and the count it records (``workers_timeline``, ``Monitor.last_workers``) and the next epoch's
pool starts from is theirs, not the local and remote ones together (``WorkerPool.own_workers``)."""

from __future__ import annotations

import threading

import pytest

import headrace as hr
from headrace.remote import Remote
from tests.helpers import ArraySource, ident_collate, jitter
from tests.ray_cluster.test_remote import ON_CPU_NODES

pytestmark = pytest.mark.ray


def local_workers(it) -> int:
    """Local (not remote) workers of the epoch ``it``'s pool, not retiring."""
    return sum(not w.external and not w.retiring for w in list(it.pool.workers.values()))


def auto_loader(interval_s: float, persistent: bool) -> hr.DataLoader:
    """1 local worker to start with (at most 2) and 2 remote ones."""
    scale = hr.AutoscaleConfig(initial=1, max_workers=2, interval_s=interval_s)
    opts = hr.Options(seed=5, autoscale=scale,
                      remote=Remote(max_workers=2, workers=2, resources=ON_CPU_NODES))
    pipe = hr.Pipeline(ArraySource(48), [hr.step(jitter, name="jitter", random=True)])
    return hr.DataLoader(pipe, batch_size=4, num_workers="auto", collate_fn=ident_collate,
                         persistent_workers=persistent, options=opts)


@pytest.mark.timeout(180)
def test_the_next_epoch_starts_the_local_workers_the_last_one_left(ray_cluster, no_actor_leaks):
    # No scaling decision (one an hour): every epoch keeps the 1 local worker it started. The
    # pool's size, 1 local and 2 remote, was recorded as the local count: the next epoch
    # started 3 local workers, the one after it 4 (capped by max_workers=2 here: 2)
    loader = auto_loader(interval_s=3600.0, persistent=False)
    try:
        started = []
        for _ in range(3):
            it = iter(loader)
            started.append(local_workers(it))
            assert sum(w.external for w in list(it.pool.workers.values())) == 2
            assert len(list(it)) == 12
        assert not loader.monitor.scaler.decisions
        assert started == [1, 1, 1]
        assert [n for _, n in loader.stats().workers_timeline] == [1]
    finally:
        loader.close()


@pytest.mark.timeout(180)
def test_the_scaler_records_the_local_workers_it_decided_on(ray_cluster, no_actor_leaks):
    # A decision every 50 ms on the local workers (``live`` leaves the remote ones out)
    # recorded the pool's size with the 2 remote workers in it: 1 local worker read as 3
    loader = auto_loader(interval_s=0.05, persistent=True)
    try:
        decisions = loader.monitor.scaler.decisions
        decided = threading.Event()  # set by the scheduler thread's tick after a decision
        loader.monitor.tick_listeners.append(lambda _sched: decisions and decided.set())
        it = iter(loader)
        batches = [next(it)]
        assert decided.wait(60)  # taken while this loop holds its batches
        batches += list(it)
        assert len(batches) == 12
        assert sum(w.external for w in list(it.pool.workers.values())) == 2
        # the epoch is over: its scheduler decides no more, and the pool persists
        assert loader.monitor.last_workers(0) == it.pool.own_workers == decisions[-1].new
    finally:
        loader.close()
