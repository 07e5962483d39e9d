"""``Options.slow_lane_share`` in the real ``Dispatcher`` and ``Lanes``: how many workers take
slow-lane samples while fresh ones may start, and that a handed-off sample still finishes.
Plain handles, no processes."""

import itertools
import multiprocessing
from types import SimpleNamespace

import pytest

from headrace.runtime.batcher import Batcher
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.dispatch import Dispatcher
from headrace.runtime.handles import Progress, WorkerHandle
from headrace.runtime.lanes import Lanes
from headrace.runtime.threadworker import ThreadTasks
from headrace.runtime.work import Counters, EpochSpec, Rec
from headrace.runtime.worker import Task

WORKERS = 8
SAMPLES = 64


class Hooks:
    """What dispatch asks the monitor: no timeout (no worker runs over it), queues of two."""

    def slow_threshold_s(self) -> float:
        return float("inf")

    def queue_depth(self) -> int:
        return 2


def setup(share: float) -> tuple[Dispatcher, Lanes, Rec]:
    """A pool of idle workers, an epoch of ``SAMPLES`` fresh samples in batches of 4 (in flight
    at most 64: fresh samples may start), and one sample handed off at step 1 in the backlog."""
    tids = itertools.count(1000)
    spec = EpochSpec(epoch=0, base_seed=0,
                     groups=iter([list(range(k, k + 4)) for k in range(0, SAMPLES, 4)]),
                     auto_collation=True, batcher=Batcher("regroup", 4), collate=list, pin=None,
                     max_in_flight=64, handoff=True, slow_lane_share=share, on_error="raise",
                     max_restarts=2, delivered=Bitmap(SAMPLES + 1), total_positions=SAMPLES + 1)
    lanes = Lanes(spec, tids)
    slow = Rec(SAMPLES, 999, Task(next(tids), 999, 1, b"partial", 0, 0, False), slow=True)
    lanes.recs[slow.task.tid] = slow
    lanes.backlog.append(slow)
    lanes.pulled = 1
    workers = {s: WorkerHandle(s, None, ThreadTasks(), None, None, ready=True)
               for s in range(WORKERS)}
    pool = SimpleNamespace(workers=workers, tids=tids,
                           progress=Progress(multiprocessing.get_context(), WORKERS))
    d = Dispatcher(pool, spec, lanes, Counters(), Hooks(), lambda: lanes.pulled - lanes.settled)
    return d, lanes, slow


def slow_takers(d: Dispatcher) -> list[int]:
    return [w.slot for w in d.pool.workers.values()
            if any(t.start > 0 for t in w.assigned.values())]


@pytest.mark.timeout(10)
def test_a_share_of_zero_keeps_every_worker_on_fresh_samples_while_they_may_start():
    # it did not: max(1, ...) gave the slow lane one worker whatever the share
    d, lanes, slow = setup(0.0)
    d.dispatch()
    assert slow_takers(d) == [] and list(lanes.backlog) == [slow]
    assert all(len(w.assigned) == 2 for w in d.pool.workers.values())  # all fresh
    # above 0, at least one worker: 0.1 of 8 rounds down to none, and one takes it
    d, lanes, _ = setup(0.1)
    d.dispatch()
    assert len(slow_takers(d)) == 1 and not lanes.backlog


@pytest.mark.timeout(10)
def test_with_a_share_of_zero_a_handed_off_sample_finishes_once_nothing_fresh_may_start():
    d, lanes, slow = setup(0.0)
    ran: list[int] = []
    for _ in range(4 * SAMPLES):  # each round, every worker finishes what it holds
        d.dispatch()
        if not any(w.assigned for w in d.pool.workers.values()):
            break
        for w in d.pool.workers.values():
            for tid, task in list(w.assigned.items()):
                del w.assigned[tid]
                lanes.recs.pop(tid)
                lanes.settled += 1
                ran.append(task.sample)
    assert sorted(ran) == [*range(SAMPLES), 999]  # every sample once, the slow one too
    # at the epoch's tail (its last fresh samples one a worker, ``Lanes.near_end``), not before
    assert ran.index(999) >= SAMPLES - 2 * WORKERS
    assert not lanes.backlog and lanes.exhausted
