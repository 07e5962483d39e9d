"""The learned timeout follows samples that got faster as promptly as slower ones
(planner/timeout.py, ``DRIFT_DOWN_RECORD``): when clearly fewer of the latest samples reach it
than its percentile implies, the window forgets the samples before them; never by chance on a
steady trace. Seeded synthetic traces fed to the pure policy, no processes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from headrace.planner.timeout import TimeoutConfig, TimeoutPolicy

from .test_timeout_fallback import STEADY, drive


def follows_at(policy: TimeoutPolicy, times: list[float]) -> int | None:
    """Samples of ``times`` fed before the timeout is within 1.5x of their own p75 (None:
    never)."""
    target = float(np.percentile(times, 75))
    for i, t in enumerate(times):
        policy.observe(t, t > policy.timeout_s)
        if target / 1.5 <= policy.timeout_s <= 1.5 * target:
            return i + 1
    return None


@pytest.mark.parametrize("name", sorted(STEADY))
def test_a_3x_drift_down_is_followed_within_a_few_hundred_samples(name: str) -> None:
    gen = STEADY[name]
    for seed in range(4):
        rnd = random.Random(seed)
        p = TimeoutPolicy()
        # steady first: the window is never cut by chance (a cut leaves DRIFT_DOWN_RECORD)
        for t in (gen(rnd) for _ in range(20_000)):
            p.observe(t, t > p.timeout_s)
            assert p.window_samples in (p._seen, p.config.window), (name, seed, p._seen)
        after = follows_at(p, [gen(rnd) / 3 for _ in range(2000)])
        # measured 88-152 samples, like a 3x drift up (120-184); the window alone took 728-792
        assert after is not None and after <= 250, (name, seed, after)
        # one cut, or two when the first kept samples from before the drift among its latest
        # (those go the next time); then the new level is steady: no more
        drive(p, [gen(rnd) / 3 for _ in range(200)])
        cuts = p.drifts_down
        assert 1 <= cuts <= 2, (name, seed, cuts)
        drive(p, [gen(rnd) / 3 for _ in range(5000)])
        assert p.drifts_down == cuts, (name, seed)


def test_the_fallback_still_engages_on_a_drift_up_after_a_drift_down() -> None:
    rnd = random.Random(3)
    gen = STEADY["lognormal"]
    p = TimeoutPolicy()
    drive(p, [gen(rnd) for _ in range(3000)] + [gen(rnd) / 3 for _ in range(3000)])
    assert p.drifts_down == 1 and not p.using_fallback
    held = drive(p, [gen(rnd) for _ in range(1000)])
    assert any(held[:300])


def test_samples_all_of_one_time_are_at_the_timeout_not_under_it() -> None:
    # p75 of 0.01 s everywhere is 0.01 s: none is over it, and none is faster either
    p = TimeoutPolicy()
    drive(p, [0.01] * 5000)
    assert p.drifts_down == 0 and p.window_samples == p.config.window
    drive(p, [0.004] * 300)  # a step down to another constant time is followed
    assert p.timeout_s == 0.004 and p.drifts_down == 1


def test_a_stored_profile_of_slower_samples_is_forgotten_once_this_run_is_faster() -> None:
    rnd = random.Random(5)
    gen = STEADY["uniform 5-15 ms"]
    stored = [float(q) for q in np.quantile([3 * gen(rnd) for _ in range(4000)],
                                            np.linspace(0, 1, 101))]
    p = TimeoutPolicy()
    p.seed(stored)
    assert p.window_stored == 101
    after = follows_at(p, [gen(rnd) for _ in range(1000)])
    assert after is not None and after <= 200, after  # measured 128; the window alone: 256
    assert p.window_stored == 0


def test_a_small_window_or_a_p90_timeout_cannot_be_judged_so_never_cuts() -> None:
    # 4 sd of chance over 128 samples is more than p90's 10%: no share is clearly under it
    rnd = random.Random(2)
    gen = STEADY["lognormal"]
    p = TimeoutPolicy(TimeoutConfig(percentile=90))
    drive(p, [gen(rnd) for _ in range(3000)] + [gen(rnd) / 3 for _ in range(500)])
    small = TimeoutPolicy(TimeoutConfig(window=64, warmup_samples=32, update_every=8))
    drive(small, [gen(rnd) for _ in range(3000)] + [gen(rnd) / 3 for _ in range(500)])
    assert p.drifts_down == 0 and small.drifts_down == 0
