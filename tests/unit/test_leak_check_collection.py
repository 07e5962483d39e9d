"""The leak checks' garbage collection (``tests/garbage.py``) waits for one another thread runs."""

import gc
import threading
import time
import weakref

from tests.garbage import Collections


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_a_collection_in_another_thread_is_waited_for_with_its_finalisers():
    """``gc.collect()`` returns at once while another thread collects: the other thread's
    finaliser (an epoch joining its workers) was still running when the leak check looked."""
    started, go, finished = threading.Event(), threading.Event(), []

    def finaliser() -> None:
        started.set()
        go.wait(10.0)  # the workers' join: the GIL is released
        finished.append(True)

    with Collections() as collections:
        waits = collections._wait_idle
        collections._wait_idle = lambda deadline: go.set() or waits(deadline)  # it waits now
        garbage = _Cycle()
        weakref.finalize(garbage, finaliser)
        del garbage
        other = threading.Thread(target=gc.collect)
        other.start()
        assert started.wait(10.0)
        collections.collect(timeout_s=10.0)
        assert finished == [True]
        other.join(10.0)


def test_a_collection_is_full_and_in_this_thread_when_none_runs_elsewhere():
    collected = []
    with Collections() as collections:
        garbage = _Cycle()
        weakref.finalize(garbage, collected.append, threading.get_ident())
        del garbage
        collections.collect(timeout_s=10.0)
    assert collected == [threading.get_ident()]
    assert collections not in gc.callbacks


def test_a_collection_whose_start_was_not_seen_is_waited_for_without_spinning():
    """A collection already running when the tracking began (a review: ``collect`` retried
    at once, 2.7 million times in 3 s, and past its timeout): waited for in short sleeps,
    within the timeout."""
    started, go = threading.Event(), threading.Event()

    def finaliser() -> None:
        started.set()
        go.wait(10.0)  # the workers' join: the GIL is released

    garbage = _Cycle()
    weakref.finalize(garbage, finaliser)
    del garbage
    other = threading.Thread(target=gc.collect)
    other.start()
    assert started.wait(10.0)
    with Collections() as collections:
        cpu0, t0 = time.thread_time(), time.monotonic()
        collections.collect(timeout_s=0.3)
        cpu, wall = time.thread_time() - cpu0, time.monotonic() - t0
    go.set()
    other.join(10.0)
    assert wall < 5.0  # the timeout held (it ran for the finaliser's 10 s)
    assert cpu < 0.5 * wall  # waited, not spun (it spun at 100%)
