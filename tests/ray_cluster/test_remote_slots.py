"""Worker slots with remote workers: a local worker keeps a local slot (its worker id, its row
of the sample cache's counters) whatever order local and remote workers start in."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

import headrace as hr
from headrace.cache.client import FIELDS
from tests.helpers import ArraySource, ident_collate, ran_at
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_ready, wait_until

pytestmark = pytest.mark.ray


@pytest.mark.timeout(180)
def test_local_worker_started_after_a_remote_one_keeps_a_local_slot(ray_cluster,
                                                                   no_actor_leaks):
    # AutoPlacement's moves, made by hand: the local worker removed, a remote worker added,
    # a local worker added again. The remote worker took the free slot 0 and the local one
    # came in slot 2, past the cache counters' 2 rows (its worker and the training process):
    # every sample it ran failed, and the epoch raised WorkerDiedError.
    n = 160
    pipe = hr.Pipeline(ArraySource(n), [hr.step(functools.partial(ran_at, "at", 0.01),
                                                name="at")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=2, cache=hr.Cache(budget_bytes=16 << 20), remote=hr.Remote(
                               max_workers=2, workers=1, resources=ON_CPU_NODES)))
    seen: Counter[int] = Counter()
    it = iter(loader)
    try:
        wait_ready(it, 1)
        pool = it.pool
        seen.update(s["i"] for s in next(it))
        first = next(w for w in pool.workers.values() if not w.external)
        first_pid = first.process.pid
        pool.retire(first)
        wait_until(lambda: first.slot not in pool.workers)  # exited and reaped
        assert loader.remote.add(pool) is not None
        assert pool.request_worker()  # forked by the training thread at its next batch
        local = set()  # (pid, worker id) of local workers that ran samples from here on
        for b in it:
            seen.update(s["i"] for s in b)
            local.update(s["at"] for s in b if s["at"][1] == 0)  # remote ids: 1 and 2
            slots = {w.slot: w.external for w in list(pool.workers.values())}
            assert all(ext for slot, ext in slots.items() if slot >= 1), slots
        assert seen == Counter(range(n))  # exactly once, no sample blamed
        new = {wid for pid, wid in local if pid != first_pid}
        assert new == {0}  # the new local worker ran samples as worker 0 of 1, as torch's
        assert loader.cache is not None
        counters, k = loader.cache.counters, len(FIELDS)
        rows = [counters.values[r * k:(r + 1) * k] for r in range(counters.rows)]
        assert rows[loader.cache.row] == [0] * k  # the training process's row is its own
        totals = counters.totals()
        assert totals["errors"] == 0
        # every sample was looked up by a local worker or finished by a remote one
        assert totals["lookups"] + loader.remote.remote_samples >= n
    finally:
        del it
        loader.close()
