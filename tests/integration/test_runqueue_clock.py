"""The run-queue clock against the real kernel: a thread that spins beside more spinning
processes than cores waits on a run queue, and ``profiler/runqueue.py`` sees it."""

import multiprocessing as mp
import os
import time

import pytest

from headrace.profiler.runqueue import run_queue_s

pytestmark = pytest.mark.integration


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def _busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_clock_counts_a_threads_wait_for_a_busy_core():
    """With more spinning processes than cores, this thread waits on a run queue while it
    spins too: the clock moves forward, and by no more than the wall time that passed."""
    # Linux, where headrace's workers run, keeps these statistics; without them the clock
    # reads 0 and the CPU share falls back to cpu / wall: that is the failure to see here
    assert os.path.exists("/proc/thread-self/schedstat"), "no /proc/thread-self/schedstat"
    _busy(0.01)
    with open("/proc/thread-self/schedstat") as f:
        assert int(f.read().split()[0]) > 0, "the kernel counts no time on a CPU (schedstats off)"
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    spinners = [ctx.Process(target=_spin, args=(stop,), daemon=True)
                for _ in range(2 * len(os.sched_getaffinity(0)))]
    for p in spinners:
        p.start()
    try:
        q0, t0 = run_queue_s(), time.perf_counter()
        _busy(0.2)  # 0.2 s of CPU: several scheduler slices, each waited for
        q1, t1 = run_queue_s(), time.perf_counter()
    finally:
        stop.set()
        for p in spinners:
            p.join(5)
    assert 0.0 < q1 - q0 <= t1 - t0
    assert run_queue_s() >= q1  # monotonic


def _child_reads_its_own(out) -> None:
    from headrace.profiler import runqueue

    run_queue_s()
    out.put(runqueue._local.f.pid == os.getpid())


def test_a_forked_child_reads_its_own_thread_not_its_parents():
    """The parent's thread opened its file before forking: the child, whose thread-local
    storage is a copy of that thread's, opens its own instead of reading the parent's."""
    run_queue_s()
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_child_reads_its_own, args=(out,))
    p.start()
    try:
        assert out.get(timeout=30) is True
    finally:
        p.join(10)
