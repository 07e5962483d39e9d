"""The leak checks' garbage collection (``tests/garbage.py``) waits for one another thread runs."""

import gc
import threading
import weakref

import tests.garbage
from tests.garbage import UNSEEN_WAIT_S, Collections


class _Cycle:
    def __init__(self) -> None:
        self.me = self


class _Blocked:
    """Another thread's collection whose finaliser (an epoch joining its workers: the GIL is
    released) runs until ``go`` is set."""

    def __init__(self) -> None:
        self.started, self.go, self.finished = threading.Event(), threading.Event(), []
        garbage = _Cycle()
        weakref.finalize(garbage, self._finaliser)
        del garbage
        self.thread = threading.Thread(target=gc.collect)
        self.thread.start()
        assert self.started.wait(10.0)

    def _finaliser(self) -> None:
        self.started.set()
        self.go.wait(10.0)
        self.finished.append(True)

    def release(self) -> None:
        self.go.set()
        self.thread.join(10.0)


class _Counting:
    """``gc`` as ``tests/garbage.py`` sees it, counting its ``collect()`` calls."""

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> int:
        self.calls += 1
        return gc.collect()

    def __getattr__(self, name):
        return getattr(gc, name)


def test_a_collection_in_another_thread_is_waited_for_with_its_finalisers():
    """``gc.collect()`` returns at once while another thread collects: the other thread's
    finaliser (an epoch joining its workers) was still running when the leak check looked."""
    with Collections() as collections:
        waits = collections._wait_idle
        blocked = _Blocked()
        collections._wait_idle = lambda deadline: blocked.go.set() or waits(deadline)  # it
        collections.collect(timeout_s=10.0)  # waits now, and lets the finaliser end
        assert blocked.finished == [True]
        blocked.release()


def test_a_collection_is_full_and_in_this_thread_when_none_runs_elsewhere():
    collected = []
    with Collections() as collections:
        garbage = _Cycle()
        weakref.finalize(garbage, collected.append, threading.get_ident())
        del garbage
        collections.collect(timeout_s=10.0)
    assert collected == [threading.get_ident()]
    assert collections not in gc.callbacks


def test_a_collection_whose_start_was_not_seen_is_waited_for_without_spinning(monkeypatch):
    """A collection already running when the tracking began (a review: ``collect`` retried
    at once, 2.7 million times in 3 s, and past its timeout): it returns at its timeout, the
    other collection still running, having tried again once per ``UNSEEN_WAIT_S`` at most."""
    counting = _Counting()
    monkeypatch.setattr(tests.garbage, "gc", counting)
    blocked = _Blocked()
    try:
        with Collections() as collections:
            collections.collect(timeout_s=0.3)
        assert blocked.finished == []  # returned at its timeout, not the finaliser's end
        assert blocked.thread.is_alive()
    finally:
        blocked.release()
    assert 1 <= counting.calls <= 0.3 / UNSEEN_WAIT_S + 2  # waits between tries, no spin
