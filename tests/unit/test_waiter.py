"""The scheduler thread's waiter gives the GIL way to a training thread leaving ``next()``:
a wake-up sent on the way out (``leaving=True``) returns from ``wait`` only once the training
thread said it left, or after ``GIVE_WAY_MAX_S``; other wake-ups return at once."""

import threading
import time

import pytest

from headrace.runtime import waiter as waiter_mod
from headrace.runtime.waiter import Waiter


class CountingTime:
    """The waiter module's ``time``: counts the give-way sleeps and signals the first."""

    def __init__(self) -> None:
        self.sleeps = 0
        self.giving_way = threading.Event()

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.giving_way.set()
        time.sleep(s)

    def monotonic(self) -> float:
        return time.monotonic()


@pytest.fixture
def clock(monkeypatch) -> CountingTime:
    c = CountingTime()
    monkeypatch.setattr(waiter_mod, "time", c)
    return c


def test_a_wake_on_the_way_out_returns_after_the_training_thread_left(clock, monkeypatch):
    monkeypatch.setattr(waiter_mod, "GIVE_WAY_MAX_S", 60.0)  # only left() ends the give-way
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
        t.join(10)
        assert not t.is_alive()
        assert order == ["left", "pass"]
    finally:
        w.left()
        t.join(10)
        w.close()


def test_the_give_way_is_bounded_and_forgotten(clock, monkeypatch):
    monkeypatch.setattr(waiter_mod, "GIVE_WAY_MAX_S", 0.2)  # a first sleep even on a busy host
    w = Waiter()
    try:
        w.wake(leaving=True)  # and no left(): a training thread that never says it left
        assert w.wait([], 10.0) == []  # returns: GIVE_WAY_MAX_S bounds it
        assert clock.sleeps >= 1 and not w._leaving
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
