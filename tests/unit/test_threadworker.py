"""Worker threads without a scheduler: resumed samples run on their own copy; retire and shut down."""

import multiprocessing
import os
import select

import numpy as np

import headrace as hr
from headrace.runtime.handles import HandOff, Progress
from headrace.runtime.pool import WorkerPool
from headrace.runtime.threadworker import ThreadResults, ThreadRun, ThreadTasks, thread_main
from headrace.runtime.worker import Task, WorkerSetup
from tests.helpers import ArraySource

CTX = multiprocessing.get_context("fork")


def bump(x: np.ndarray) -> np.ndarray:
    x += 1  # in place, as many augmentations do
    return x


def pipeline() -> hr.Pipeline:
    return hr.Pipeline(ArraySource(4), [hr.step(lambda x: x, name="a"), hr.step(bump, name="bump")])


def test_each_resumed_attempt_runs_on_its_own_copy_of_the_partial_value():
    pipe = pipeline()
    setup = WorkerSetup(0, 1, 0, pipe, None, None, os.getpid(), False)
    tasks, results = ThreadTasks(), ThreadResults()
    partial = np.zeros(1, np.float32)
    for tid in (1, 2):  # the same resumed sample twice: a retry after its first worker went away
        tasks.send(Task(tid, 0, 2, partial, 0, 0, False))
    tasks.send(None)
    run = ThreadRun(thread_main, (setup, tasks, results, HandOff(CTX, 3), Progress(CTX, 1)), "t")
    run.start()
    msgs = [results.recv() for _ in range(3)]
    run.join(10.0)
    assert not run.is_alive() and run.exitcode == 0
    assert msgs[0] == ("ready", 0)
    assert [m[:2] for m in msgs[1:]] == [("done", 1), ("done", 2)]
    for m in msgs[1:]:
        np.testing.assert_array_equal(m[2], np.ones(1))  # bump ran once on each attempt
    np.testing.assert_array_equal(partial, np.zeros(1))  # the scheduler's copy is intact
    results.close()
    run.close()


def test_a_retired_thread_exits_and_its_sentinel_says_so():
    pool = WorkerPool(pipeline(), None, CTX, None, 0, 2, profile=False, executor="threads")
    try:
        pool.start(2)
        a, b = pool.workers[0], pool.workers[1]
        assert a.ring is None and a.process.pid is None
        pool.retire(a)
        readable, _, _ = select.select([a.sentinel], [], [], 10.0)
        assert readable == [a.sentinel]
        a.process.join(10.0)
        assert not a.process.is_alive() and a.process.exitcode == 0
        pool.reap(a)
        assert list(pool.workers) == [1] and b.process.is_alive()
    finally:
        pool.shutdown()
    assert not b.process.is_alive() and not pool.workers
