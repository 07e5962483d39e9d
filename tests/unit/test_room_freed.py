"""Scheduler.room_freed with worker threads: the training thread dispatches when the lock is
free, wakes the scheduler thread when it is not, and an error in the dispatch ends the epoch
through the output queue (the training loop gets it after the batches already queued)."""

import multiprocessing
import os
import queue
import select
import threading

import headrace as hr
from headrace.runtime.batcher import Batcher
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.pool import WorkerPool
from headrace.runtime.scheduler import Scheduler
from headrace.runtime.work import EpochSpec
from tests.helpers import ArraySource

CTX = multiprocessing.get_context("fork")


class Hooks:
    """The two monitor hooks dispatch asks for: no timeout learned yet."""

    def slow_threshold_s(self) -> float:
        return float("inf")

    def on_tick(self, sched) -> None:
        pass


def groups(fail_at: int):
    for i in range(10):
        if i == fail_at:
            raise LookupError(f"sampler broke at {i}")
        yield [i]


def scheduler(fail_at: int) -> tuple[Scheduler, WorkerPool, queue.Queue]:
    pipe = hr.Pipeline(ArraySource(10), [])
    pool = WorkerPool(pipe, None, CTX, None, 0, 1, profile=False, executor="threads")
    pool.start(1)
    pool.workers[0].ready = True  # its "ready" message waits for a scheduler thread not started
    spec = EpochSpec(epoch=0, base_seed=0, groups=groups(fail_at), auto_collation=True,
                     batcher=Batcher("regroup", 1), collate=lambda b: b, pin=None,
                     max_in_flight=4, handoff=False, slow_lane_share=0.25, on_error="raise",
                     max_restarts=2, delivered=Bitmap(10), total_positions=10)
    out: queue.Queue = queue.Queue()
    return Scheduler(pool, spec, Hooks(), out), pool, out


def test_the_training_thread_dispatches_and_a_sampler_error_goes_to_the_output_queue():
    sched, pool, out = scheduler(fail_at=0)
    try:
        sched.room_freed()  # does not raise: the sampler's error ends the epoch instead
        kind, err, _ = out.get_nowait()
        assert kind == "error" and isinstance(err, LookupError)
        assert "sampler broke at 0" in str(err)
        assert sched._finished
        assert sched._lock.acquire(blocking=False)  # released again
        sched._lock.release()
    finally:
        sched.stop()
        pool.shutdown()


def test_dispatch_happens_in_the_training_thread_when_the_lock_is_free():
    sched, pool, out = scheduler(fail_at=5)
    try:
        sched.room_freed()
        assert len(pool.workers[0].assigned) == 2  # two samples sent, no wake-up byte needed
        assert select.select([sched._wake_r], [], [], 0)[0] == []
    finally:
        sched.stop()
        pool.shutdown()


def test_with_the_lock_held_elsewhere_the_scheduler_thread_is_woken():
    sched, pool, out = scheduler(fail_at=5)
    held, done = threading.Event(), threading.Event()

    def hold():
        with sched._lock:
            held.set()
            done.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(10)
        sched.room_freed()
        assert not pool.workers[0].assigned  # nothing dispatched from here
        assert os.read(sched._wake_r, 1) == b"x"
        assert not sched._waiter._leaving  # not from mark(): the training thread may wait
        sched.room_freed(leaving=True)  # from mark(), on the way out of next()
        assert sched._waiter._leaving and os.read(sched._wake_r, 1) == b"x"
        sched.left()
        assert not sched._waiter._leaving
    finally:
        done.set()
        t.join()
        sched.stop()
        pool.shutdown()
