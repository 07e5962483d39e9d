import threading

import pytest

from headrace.runtime.daemon_pool import DaemonPool


def test_calls_run_on_daemon_threads_and_their_futures_hold_results_and_errors():
    pool = DaemonPool(1, "t-pool")
    names = []

    def where():
        names.append((threading.current_thread().name, threading.current_thread().daemon))
        return len(names)

    def fails():
        raise KeyError("bad batch")

    futures = [pool.submit(where), pool.submit(fails), pool.submit(where)]
    assert futures[0].result(10) == 1 and futures[2].result(10) == 2
    with pytest.raises(KeyError, match="bad batch"):
        futures[1].result(10)
    assert names == [("t-pool_0", True)] * 2
    pool.shutdown()


def test_shutdown_cancels_what_has_not_started_and_does_not_wait_for_what_runs():
    pool = DaemonPool(1, "t-pool")
    started, release = threading.Event(), threading.Event()

    def blocks():
        started.set()
        release.wait(30)
        return "done"

    running = pool.submit(blocks)
    queued = pool.submit(lambda: "never")
    assert started.wait(10)
    pool.shutdown()  # returns while ``blocks`` still runs
    assert queued.cancelled() and not running.done()
    release.set()
    assert running.result(10) == "done"
    pool._threads[0].join(10)
    assert not pool._threads[0].is_alive()  # the thread ended after its call


def test_a_pool_needs_a_thread():
    with pytest.raises(ValueError, match="at least one thread"):
        DaemonPool(0, "t-pool")
