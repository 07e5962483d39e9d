import math

import numpy as np
import pytest

from headrace.planner.timeout import (
    HANDOFF_MIN_S,
    TimeoutConfig,
    TimeoutPolicy,
    move_cost,
    remaining_after,
    worth_moving,
)


def feed(policy, times, slow=lambda t, p: t > p.timeout_s):
    for t in times:
        policy.observe(t, slow(t, policy))


def test_no_timeout_during_warmup_then_p75():
    p = TimeoutPolicy(TimeoutConfig(warmup_samples=100, update_every=1000))
    rng = np.random.default_rng(0)
    times = rng.uniform(0.0, 1.0, 100)
    feed(p, times[:99])
    assert math.isinf(p.timeout_s) and p.warming_up
    feed(p, times[99:])
    assert not p.warming_up
    assert p.timeout_s == pytest.approx(np.percentile(times, 75))


def test_falls_back_to_p90_when_too_many_samples_go_slow():
    cfg = TimeoutConfig(warmup_samples=64, update_every=16, window=256, max_slow_fraction=0.35)
    p = TimeoutPolicy(cfg)
    feed(p, [0.01] * 48 + [0.02] * 16)  # warm-up: p75 = 0.0125 (interpolated)
    assert p.timeout_s < 0.02
    # drift: every sample now takes 0.03 s, all classified slow
    feed(p, [0.03] * 32)
    assert p.using_fallback
    assert p.history[-1][2] == cfg.fallback_percentile


def test_keeps_adapting_to_drift():
    cfg = TimeoutConfig(warmup_samples=32, update_every=8, window=64)
    p = TimeoutPolicy(cfg)
    feed(p, [0.01] * 32)
    first = p.timeout_s
    feed(p, [0.5] * 200)
    assert p.timeout_s > 10 * first


def test_fixed_timeout_never_changes():
    p = TimeoutPolicy(TimeoutConfig(fixed_s=0.2))
    feed(p, [1.0] * 500)
    assert p.timeout_s == 0.2
    assert not p.warming_up


@pytest.mark.parametrize(
    "kw", [{"percentile": 0}, {"percentile": 95, "fallback_percentile": 90}, {"window": 2}]
)
def test_bad_config_is_rejected(kw):
    with pytest.raises(ValueError):
        TimeoutConfig(**kw)


def test_remaining_after_sums_the_steps_left_less_the_moves_cost():
    assert remaining_after([0.01, 0.02, 0.03]) == pytest.approx([0.06, 0.05, 0.03, 0.0])
    # forwarding a sample costs 25 ms: after the first step 25 ms of steps are left net, after
    # the second only 5 ms, so a sample late there does not move (the worker wants half the
    # timeout or more); past the last step nothing is left either way
    assert remaining_after([0.01, 0.02, 0.03], 0.025) == pytest.approx([0.035, 0.025, 0.005, 0.0])


def test_a_late_sample_moves_only_with_half_the_timeout_and_two_ms_of_steps_left():
    assert not worth_moving(0.009, 0.010, 0.5)  # not late
    assert worth_moving(0.011, 0.010, 0.005)  # late, half the timeout left
    assert not worth_moving(0.011, 0.010, 0.004)  # late, too little left to gain
    assert not worth_moving(0.011, 0.010, -0.001)  # the move costs more than the steps left
    # CIFAR-sized samples: 0.1 ms steps, late because preempted; 0.08 ms left is over half the
    # timeout but under what a move itself costs: they stay
    assert not worth_moving(0.0003, 0.0001, 0.00008)
    assert worth_moving(0.0003, 0.0001, HANDOFF_MIN_S)
    assert not worth_moving(math.inf, math.inf, math.inf)  # no timeout yet (warm-up)


def test_move_cost_is_the_mean_once_four_moves_measured_it():
    assert move_cost(0, 0.0) == 0.0
    assert move_cost(3, 0.3) == 0.0  # too few: one move may carry one-off costs
    assert move_cost(4, 0.5) == pytest.approx(0.125)


def test_percentile_is_numpys_linear_percentile_bit_for_bit():
    from headrace.planner.timeout import percentile

    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 7, 64, 1000, 1024):
        a = np.sort(rng.lognormal(size=n) * 1e-3)
        for q in (0.0, 25.0, 50.0, 75.0, 90.0, 99.9, 100.0):
            assert percentile(a, q) == float(np.percentile(a, q))
    assert math.isnan(percentile(np.array([]), 50.0))


def test_typical_time_is_the_median_once_warm_and_also_with_a_fixed_timeout():
    times = [0.001] * 40 + [0.003] * 24
    learned = TimeoutPolicy(TimeoutConfig(warmup_samples=64, update_every=32))
    fixed = TimeoutPolicy(TimeoutConfig(warmup_samples=64, update_every=32, fixed_s=0.5))
    for p in (learned, fixed):
        feed(p, times[:63])
        assert math.isnan(p.typical_s)  # not known during warm-up
    feed(learned, times[63:])
    assert learned.typical_s == pytest.approx(0.001)
    feed(fixed, times[63:] + [0.003] * 64)  # the fixed timeout refreshes it every update_every
    assert fixed.typical_s == pytest.approx(np.median(times + [0.003] * 64))
    assert fixed.timeout_s == 0.5


def test_a_stored_profiles_quantiles_are_not_counted_as_samples_and_leave_the_window_first():
    p = TimeoutPolicy(TimeoutConfig(window=64, warmup_samples=8, update_every=1))
    p.seed([1.0] * 20)  # a reused profile's quantiles: summary points, not samples
    assert (p.window_samples, p.window_stored) == (0, 20)
    assert not p.warming_up and p.timeout_s == 1.0
    feed(p, [0.01] * 44, slow=lambda t, p: False)  # the window fills: nothing leaves yet
    assert (p.window_samples, p.window_stored) == (44, 20)
    feed(p, [0.01] * 10, slow=lambda t, p: False)  # now the quantiles leave, oldest first
    assert (p.window_samples, p.window_stored) == (54, 10)
    feed(p, [0.01] * 10, slow=lambda t, p: False)
    assert (p.window_samples, p.window_stored) == (64, 0)
    assert p.timeout_s == 0.01  # what this run measured, the stored values gone


def test_a_second_stored_profile_replaces_the_first_and_measured_samples_win_the_window():
    p = TimeoutPolicy(TimeoutConfig(window=16, warmup_samples=4, update_every=1))
    feed(p, [0.5] * 10, slow=lambda t, p: False)
    p.seed([2.0] * 8)  # 8 + 10 > 16: two quantiles do not fit, the samples stay
    assert (p.window_samples, p.window_stored) == (10, 6)
    p.seed([3.0] * 4)
    assert (p.window_samples, p.window_stored) == (10, 4)
    assert sorted(p._times) == [0.5] * 10 + [3.0] * 4


def test_the_timeout_is_the_percentile_of_the_window_it_holds_after_every_update():
    # recomputes convert only the samples appended since the last one (_window_array): the
    # result must be np.percentile of exactly what the window holds, through seeds, ignored
    # times, drift cuts, fallbacks and a window filling up
    rng = np.random.default_rng(4)
    cfg = TimeoutConfig(warmup_samples=40, update_every=7, window=300)
    p = TimeoutPolicy(cfg)
    levels = np.repeat(rng.choice([0.003, 0.01, 0.03], 30), 200)
    checked, cuts = 0, 0
    for i, level in enumerate(levels):
        if i == 10 or p.drifts_down > cuts == 0:  # after the first cut only (a full window
            p.seed(list(rng.uniform(0.0, 0.05, 50)))  # keeps its samples, no seed)
        cuts = p.drifts_down
        t = float(rng.lognormal(np.log(level), 0.4)) if i % 97 else math.nan
        p.observe(t, t > p.timeout_s)
        if len(p.history) and p.history[-1][0] == p._seen and p._since_update == 0:
            window = np.fromiter(p._times, float)
            assert p.timeout_s == np.percentile(window, p.history[-1][2]), i
            assert p.typical_s == np.percentile(window, 50.0), i
            checked += 1
    assert checked > 500 and cuts > 1 and p.window_stored == 0
