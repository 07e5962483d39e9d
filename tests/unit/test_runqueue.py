"""The run-queue clock and what the profile does with it: a step's wait for a core is
recorded apart from its wall time, so the CPU share the worker count is sized from does not
fall with the load it was measured under (``profiler/runqueue.py``)."""

import pytest

from headrace.pipeline import Pipeline
from headrace.pipeline.runner import SampleRunner, StepTiming
from headrace.profiler import sizes
from headrace.profiler.report import StepStats, cpu_share
from headrace.profiler.stats import Profiler
from tests.helpers import ArraySource


def test_a_measured_run_records_each_steps_wait_within_its_wall_time():
    pipe = Pipeline(ArraySource(4))
    ticks = iter(range(0, 1000, 1))  # a clock that moves 1 s per read: 1 s per step...
    measured = SampleRunner(pipe, sizes.measure, queued=lambda: float(next(ticks)))
    out = measured.run(0, 0, None, base_seed=0, epoch=0)
    # ...capped at the step's wall time (a wait cannot exceed the step)
    assert out.timings and all(0.0 < t.queued <= t.wall for t in out.timings)
    plain = SampleRunner(pipe, None, queued=lambda: 1 / 0)  # never read when not measuring
    assert all(t.queued == 0.0 for t in plain.run(0, 0, None, base_seed=0, epoch=0).timings)


def test_the_profile_keeps_the_mean_wait_per_step_and_old_profiles_read_zero():
    prof = Profiler(["load", "decode"], batch=2)
    for q in (0.001, 0.003):
        prof.observe([StepTiming(0, 0.001, 0.001), StepTiming(1, 0.010, 0.006, queued=q)],
                     [10, 20])
    prof.observe([StepTiming(1, 0.010, 0.006, queued=0.002)], [20], bytes_in=10)  # a segment
    steps = prof.report().steps
    assert steps[0].queued_mean == 0.0
    assert steps[1].queued_mean == pytest.approx(0.002)
    d = steps[1].__dict__.copy()
    del d["queued_mean"]  # a profile stored before the field existed
    assert StepStats(**d).queued_mean == 0.0


def _step(wall: float, cpu: float, queued: float = 0.0) -> StepStats:
    return StepStats("s", 10, wall, wall, wall, cpu, 0.0, 0.0, None, None, None, None, None,
                     queued_mean=queued)


def test_the_cpu_share_leaves_out_the_wait_for_a_core():
    """imagenet's steps on 2 busy cores: 6 ms of CPU in 8.7 ms of wall, 2.5 ms of it queued.
    cpu / wall reads 0.69 and sized the pool at 3 workers; without the wait it is 0.97."""
    busy = [_step(0.0007, 0.0007, 0.0002), _step(0.008, 0.0053, 0.0023)]
    assert cpu_share(busy) == pytest.approx(0.006 / 0.0062)
    assert cpu_share([_step(0.125, 0.0088)]) == pytest.approx(0.0704, abs=1e-3)  # sleeps: kept
    assert cpu_share([_step(0.01, 0.0101)]) == 1.0  # clock reads a few µs apart: one core
    assert cpu_share([_step(0.0, 0.0)]) is None


def test_a_sample_of_microseconds_has_no_cpu_share():
    """A dataset returning its index: 2 µs of CPU in 9 µs of wall, the profiler's own clock
    reads most of it. Read as a share of 0.23 it started 9 worker processes on 2 cores."""
    from headrace.profiler.report import MIN_SHARE_WALL_S

    assert cpu_share([_step(9e-6, 2e-6)]) is None
    assert cpu_share([_step(MIN_SHARE_WALL_S * 2, MIN_SHARE_WALL_S * 0.3,
                            MIN_SHARE_WALL_S * 1.5)]) is None  # what is left once the wait is out
    assert cpu_share([_step(MIN_SHARE_WALL_S, MIN_SHARE_WALL_S / 2)]) == pytest.approx(0.5)
