"""The scheduler thread's waiter gives the GIL way to a training thread leaving ``next()``:
a wake-up sent on the way out (``leaving=True``) returns from ``wait`` only once the training
thread said it left, or after ``GIVE_WAY_MAX_S``; other wake-ups return at once.

The waiter's clock is a stand-in: its ``sleep`` advances a virtual ``monotonic`` instead of
sleeping, and can hold the sleeping thread on an event, so no test waits on real time."""

import threading

import pytest

from headrace.runtime import waiter as waiter_mod
from headrace.runtime.waiter import Waiter


class FakeTime:
    """The waiter module's ``time``: ``sleep(s)`` counts, moves ``monotonic`` on by ``s``,
    signals ``giving_way`` and, with ``hold``, blocks until that event is set."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.giving_way = threading.Event()
        self.hold = hold

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.now += s
        self.giving_way.set()
        if self.hold is not None:
            assert self.hold.wait(10)


@pytest.fixture
def clock(monkeypatch) -> FakeTime:
    c = FakeTime()
    monkeypatch.setattr(waiter_mod, "time", c)
    return c


def test_a_wake_on_the_way_out_returns_after_the_training_thread_left(clock):
    clock.hold = released = threading.Event()  # the give-way's first sleep lasts until left()
    w = Waiter()
    order: list[str] = []

    def scheduler_thread():
        w.wait([], 10.0)
        order.append("pass")

    t = threading.Thread(target=scheduler_thread, daemon=True)
    t.start()
    try:
        w.wake(leaving=True)
        assert clock.giving_way.wait(10), "the woken thread went straight to its pass"
        order.append("left")
        w.left()
        released.set()
        t.join(10)
        assert not t.is_alive()
        assert order == ["left", "pass"]
        assert clock.sleeps == 1  # left() ended it: no second sleep
    finally:
        w.left()
        released.set()
        t.join(10)
        w.close()


def test_the_give_way_is_bounded_and_forgotten(clock):
    w = Waiter()
    try:
        w.wake(leaving=True)  # and no left(): a training thread that never says it left
        assert w.wait([], 10.0) == []  # returns: GIVE_WAY_MAX_S of (virtual) sleeps bound it
        assert clock.sleeps == pytest.approx(waiter_mod.GIVE_WAY_MAX_S / waiter_mod.GIVE_WAY_S,
                                             abs=1)
        assert clock.now >= waiter_mod.GIVE_WAY_MAX_S and not w._leaving
        slept = clock.sleeps
        w.wake()
        assert w.wait([], 10.0) == []
        assert clock.sleeps == slept  # the give-way did not outlive its wake-up
    finally:
        w.close()


def test_other_wake_ups_do_not_give_way(clock):
    w = Waiter()
    try:
        w.wake()
        assert w.wait([], 10.0) == []
        w.wake(leaving=True)
        w.left()  # out of next() before the scheduler thread looked
        assert w.wait([], 10.0) == []
        assert clock.sleeps == 0
    finally:
        w.close()
