"""Which slot a worker gets: the pool's own workers below ``local_slots``, a backend's above."""

import multiprocessing
import select

import pytest

import headrace as hr
from headrace.runtime.pool import WorkerPool
from tests.helpers import ArraySource

CTX = multiprocessing.get_context("fork")


def backend_start(pool: WorkerPool):
    """A backend's kind of worker (as ``remote/``'s proxies): here a worker thread marked
    external."""
    def start(setup):
        h = pool._start_thread(setup)
        h.external = True
        return h
    return start


@pytest.mark.timeout(30)
def test_own_and_backend_workers_keep_to_their_slots():
    # AutoPlacement's moves: the local worker removed, a remote one added, a local one added.
    # The remote worker took slot 0 and the local one came past the cache counters' rows.
    pool = WorkerPool(hr.Pipeline(ArraySource(4), []), None, CTX, None, 0, 3, profile=False,
                      executor="threads", backend_slots=2)
    try:
        pool.start(1)
        remote = pool.add_worker(start=backend_start(pool))
        assert remote is not None and remote.slot == 1
        first = pool.workers[0]
        pool.retire(first)
        select.select([first.sentinel], [], [], 10.0)
        first.process.join(10.0)
        pool.reap(first)
        assert list(pool.workers) == [1]
        again = pool.add_worker(start=backend_start(pool))
        assert again is not None and again.slot == 2  # not the local slot 0
        assert pool.add_worker(start=backend_start(pool)) is None  # every backend slot taken
        assert pool.request_worker()  # a thread: started at once
        assert pool.workers[0].external is False
        assert not pool.request_worker() and pool.full  # one local slot, taken
    finally:
        pool.shutdown()


def test_the_cache_counters_need_a_row_per_local_slot_and_the_training_process():
    class Client:  # what the pool reads of a cache client
        class counters:  # noqa: N801
            rows = 2

    with pytest.raises(ValueError, match="2 rows for 2 worker slots"):
        WorkerPool(hr.Pipeline(ArraySource(4), []), None, CTX, None, 0, 4, profile=False,
                   executor="threads", cache=Client(), backend_slots=2)
    pool = WorkerPool(hr.Pipeline(ArraySource(4), []), None, CTX, None, 0, 3, profile=False,
                      executor="threads", cache=Client(), backend_slots=2)
    pool.shutdown()


@pytest.mark.timeout(30)
def test_own_workers_counts_the_local_ones_and_those_asked_for():
    # what num_workers="auto" records and starts the next epoch from: size counts a backend's
    # workers too (1 local and 2 remote read as 3 local workers at the next epoch's start)
    pool = WorkerPool(hr.Pipeline(ArraySource(4), []), None, CTX, None, 0, 5, profile=False,
                      executor="threads", backend_slots=2)
    try:
        pool.start(1)
        for _ in range(2):
            assert pool.add_worker(start=backend_start(pool)) is not None
        assert pool.size == 3 and pool.own_workers == 1
        pool.requests.ask(None, 2)  # asked for by the scaler, to fork on the training thread
        assert pool.own_workers == 2
        pool.requests.drop()
        pool.retire(pool.workers[0])
        assert pool.own_workers == 0
    finally:
        pool.shutdown()
