"""``Dispatcher._steal``: an idle worker takes over a task queued behind a slow sample, only
a worker that runs it (``WorkerHandle.runs``). Plain handles, no processes."""

import itertools
import multiprocessing
import time
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

SPLIT = 2
"""Where the remote workers' part of a sample ends."""


class Hooks:
    """What dispatch asks the monitor: a 1 s timeout."""

    def slow_threshold_s(self) -> float:
        return 1.0

    def queue_depth(self) -> int:
        return 2


def handle(slot: int, runs=None) -> WorkerHandle:
    return WorkerHandle(slot, None, ThreadTasks(), None, None, ready=True, runs=runs)


def dispatcher(*idle: WorkerHandle) -> tuple[Dispatcher, WorkerHandle, Task]:
    """A dispatcher whose local worker 0 has run a sample for 10 s (over the timeout), a sample
    handed back at the split point queued behind it, and ``idle`` workers; the epoch has
    nothing else to give."""
    tids = itertools.count(100)
    spec = EpochSpec(epoch=0, base_seed=0, groups=iter([]), auto_collation=True,
                     batcher=Batcher("regroup", 1), collate=lambda b: b, pin=None,
                     max_in_flight=8, handoff=True, slow_lane_share=0.25, on_error="raise",
                     max_restarts=2, delivered=Bitmap(8), total_positions=8)
    lanes = Lanes(spec, tids)
    busy = handle(0)
    running = Task(1, 5, 0, None, 0, 0, True)
    queued = Task(2, 6, SPLIT, b"partial", 0, 0, False)  # finished remotely up to the split
    for position, task in enumerate((running, queued)):
        busy.assigned[task.tid] = task
        lanes.recs[task.tid] = Rec(position, task.sample, task, slow=task.start > 0, worker=0)
    progress = Progress(multiprocessing.get_context(), 1 + len(idle))
    progress.tid[0], progress.started[0] = running.tid, time.monotonic() - 10.0
    pool = SimpleNamespace(workers={w.slot: w for w in (busy, *idle)}, progress=progress,
                           tids=tids)
    return Dispatcher(pool, spec, lanes, Counters(), Hooks(), lambda: 2), busy, queued


def remote(slot: int) -> WorkerHandle:
    return handle(slot, runs=lambda task: task.start < SPLIT)


@pytest.mark.timeout(10)
def test_a_remote_worker_takes_no_sample_handed_back_at_its_split():
    # it did: the proxy sent it straight back, a round trip for nothing (one more forwarded)
    thief = remote(1)
    d, busy, queued = dispatcher(thief)
    d.dispatch()
    assert thief.assigned == {} and d.counters.moved == 0
    assert list(busy.assigned) == [1, queued.tid]  # it waits for the local worker


@pytest.mark.timeout(10)
def test_a_local_worker_takes_it_even_after_an_idle_remote_one():
    thief, local = remote(1), handle(2)
    d, busy, queued = dispatcher(thief, local)
    d.dispatch()
    assert thief.assigned == {} and list(busy.assigned) == [1]
    (moved,) = local.assigned.values()
    assert (moved.sample, moved.start, moved.payload) == (queued.sample, SPLIT, b"partial")
    assert moved.tid != queued.tid and d.counters.moved == 1
