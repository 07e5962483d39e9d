"""The remaining step times workers read to decide a hand-off (``Monitor._push_remaining``),
when the profile starts afresh: a new step order (AutoOrder) or a new executor.

Workers move a late sample only if its steps left typically take half the timeout and 2 ms
(``planner.timeout.worth_moving``); ``inf`` means unknown and lets every late sample move. A new
profile has no medians of its own for its first ``REMAINING_MIN_SAMPLES`` samples: the epoch
after a reorder handed off 4-12 samples whose steps left took microseconds (a bug hunt's find)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import headrace as hr
from headrace.pipeline.runner import StepTiming
from headrace.planner.timeout import remaining_after
from headrace.runtime.handles import HandOff
from headrace.runtime.monitor import REMAINING_MIN_SAMPLES, Monitor

NAMES = ["load", "noise", "crop"]
WALL = {"load": 1e-5, "noise": 3e-3, "crop": 1e-4}  # seconds, every sample


def monitor(samples: int) -> Monitor:
    m = Monitor(hr.Options(profile_store=False), autoscale=False, step_names=NAMES)
    m.use_executor("processes")
    for i in range(samples):
        m.on_sample(i, sum(WALL.values()), False,
                    [StepTiming(k, WALL[n], WALL[n]) for k, n in enumerate(NAMES)])
    return m


class Pool:
    """What ``_push_remaining`` reads of a pool: its real ``HandOff``, without workers."""

    def __init__(self, steps: int) -> None:
        self.handoff = HandOff(mp.get_context(), steps)


def pushed(m: Monitor) -> list[float]:
    """What a pool's workers read after the next push."""
    assert m.profiler is not None
    pool = Pool(len(m.profiler.step_names))
    m._push_remaining(pool)
    return list(pool.handoff.remaining)


def test_a_new_step_order_keeps_each_steps_median_until_it_is_measured_again():
    m = monitor(REMAINING_MIN_SAMPLES)
    m.new_profile(["load", "crop", "noise"])  # AutoOrder moved the crop up
    want = remaining_after([WALL["load"], WALL["crop"], WALL["noise"]])
    assert pushed(m) == pytest.approx(want)


def test_a_new_executor_keeps_the_step_medians_too():
    m = monitor(REMAINING_MIN_SAMPLES)
    m.use_executor("threads")  # executor="auto" decided
    assert m.profiler is not None and m.profiler.samples == 0
    assert pushed(m) == pytest.approx(remaining_after([WALL[n] for n in NAMES]))


def test_a_profile_of_too_few_samples_leaves_the_known_medians():
    m = monitor(REMAINING_MIN_SAMPLES - 1)
    m.known_step_p50 = {"load": 1.0, "noise": 2.0, "crop": 4.0}  # a stored profile's
    m.new_profile(["load", "crop", "noise"])
    assert pushed(m) == pytest.approx(remaining_after([1.0, 4.0, 2.0]))



def test_the_push_takes_the_step_medians_without_building_a_report(monkeypatch):
    """The push runs once a second in the scheduler thread: the whole report (every step's
    quantiles and the totals' grid) was 1.2 ms of the training process's CPU each time."""
    m = monitor(4 * REMAINING_MIN_SAMPLES)
    assert m.profiler is not None
    want = remaining_after([s.wall_p50 for s in m.profiler.report().steps])

    def no_report() -> None:
        raise AssertionError("report() built for the push")

    monkeypatch.setattr(m.profiler, "report", no_report)
    assert pushed(m) == pytest.approx(want)
