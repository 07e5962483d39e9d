"""When the learned timeout falls back to p90 (planner/timeout.py, MinatoLoader §4.2): only when
more samples go slow than the percentile implies beyond chance (skew, drift), never by chance on
a steady trace; and what it does with times that are not numbers of seconds. Seeded synthetic
traces fed to the pure policy, no processes."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from headrace.planner.timeout import TimeoutConfig, TimeoutPolicy, slow_share_limit

Gen = Callable[[random.Random], float]
STEADY: dict[str, Gen] = {
    "lognormal": lambda r: r.lognormvariate(-4.6, 0.5),  # ~10 ms median
    "uniform 5-15 ms": lambda r: r.uniform(0.005, 0.015),
    "gauss 10+-1 ms": lambda r: max(1e-6, r.gauss(0.010, 0.001)),
}


def drive(policy: TimeoutPolicy, times: list[float]) -> list[bool]:
    """Feed ``times`` (s), a sample going slow when over the timeout of the moment; whether the
    fallback held after each."""
    held = []
    for t in times:
        policy.observe(t, t > policy.timeout_s)
        held.append(policy.using_fallback)
    return held


@pytest.mark.parametrize("name", sorted(STEADY))
def test_a_steady_trace_almost_never_falls_back(name: str) -> None:
    # the old rule (0.35 over the last 128 flags, 2.6 sd above p75's 25%) held the fallback
    # for 14-19% of these samples, 2.8-3.7 times per 20,000
    gen = STEADY[name]
    for seed in range(4):
        rnd = random.Random(seed)
        held = drive(TimeoutPolicy(), [gen(rnd) for _ in range(20_000)])
        assert sum(held) / len(held) < 0.01, (name, seed)


@pytest.mark.parametrize("name", sorted(STEADY))
def test_a_3x_drift_falls_back_within_a_few_hundred_samples_then_settles(name: str) -> None:
    gen = STEADY[name]
    rnd = random.Random(7)
    times = [gen(rnd) for _ in range(5000)] + [3 * gen(rnd) for _ in range(8000)]
    held = drive(TimeoutPolicy(), times)
    assert not any(held[:5000])
    assert any(held[5000:5300])  # measured: 88-184 samples after the shift
    # the new level is steady again: the fallback runs out and does not come back
    assert not any(held[-4000:])


@pytest.mark.parametrize("pct", [50.0, 60.0, 80.0])
def test_the_threshold_follows_the_configured_percentile(pct: float) -> None:
    # p60 sends 40% slow by design: judged against p75's 0.35 it sat under p90 90% of the time
    rnd = random.Random(1)
    p = TimeoutPolicy(TimeoutConfig(percentile=pct))
    times = [STEADY["lognormal"](rnd) for _ in range(20_000)]
    slow = 0
    for i, t in enumerate(times):
        slow += i >= 1000 and t > p.timeout_s
        p.observe(t, t > p.timeout_s)
        assert not p.using_fallback, i
    assert slow / 19_000 == pytest.approx(1 - pct / 100, abs=0.03)


def test_a_fixed_share_at_or_under_what_the_percentile_implies_is_refused() -> None:
    with pytest.raises(ValueError, match="percentile=60 sends slow by design"):
        TimeoutConfig(percentile=60, max_slow_fraction=0.35)
    TimeoutConfig(percentile=60, max_slow_fraction=0.5)  # above 40%: accepted


def test_the_limit_is_the_implied_share_plus_four_sd_of_flags_and_basis() -> None:
    assert slow_share_limit(75.0, 1024, 1024) == pytest.approx(
        0.25 + 4 * math.sqrt(0.1875 * 2 / 1024))
    assert slow_share_limit(75.0, 1024, 1024) == pytest.approx(0.327, abs=1e-3)
    assert slow_share_limit(90.0, 32, 1024) == pytest.approx(
        0.10 + 4 * math.sqrt(0.09 * (1 / 32 + 1 / 1024)))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_times_that_are_not_finite_are_ignored(bad: float) -> None:
    p = TimeoutPolicy(TimeoutConfig(warmup_samples=8, window=8, update_every=1))
    for t in (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08):
        p.observe(t, False)
    before, changes = p.timeout_s, len(p.history)
    for _ in range(20):
        p.observe(bad, False)
    assert p.timeout_s == before and math.isfinite(p.typical_s)
    assert len(p.history) == changes  # nan != nan made every recompute a "change"
    p.seed([bad, 0.5, bad])
    assert math.isfinite(p.timeout_s)


def test_a_negative_time_counts_as_zero() -> None:
    p = TimeoutPolicy(TimeoutConfig(warmup_samples=8, window=8, update_every=1))
    for _ in range(8):
        p.observe(-1.0, False)
    assert p.timeout_s == 0.0 and p.typical_s == 0.0
    p.seed([-2.0])
    assert p.timeout_s == 0.0


def test_loader_stats_say_a_fixed_timeout_has_no_percentile_and_which_one_fell_back() -> None:
    import headrace as hr  # a loader never iterated: no process starts

    fixed = hr.DataLoader(list(range(8)), batch_size=2,
                          options=hr.Options(timeout=TimeoutConfig(fixed_s=0.005)))
    st = fixed.stats()
    assert math.isnan(st.timeout_percentile) and st.timeout_fallback_from is None
    cfg = TimeoutConfig(percentile=80, warmup_samples=64, update_every=16, window=256)
    learned = hr.DataLoader(list(range(8)), batch_size=2, options=hr.Options(timeout=cfg))
    assert learned.stats().timeout_percentile == 80.0
    drive(learned.monitor.timeout, [0.01] * 48 + [0.02] * 16 + [0.03] * 32)  # drift: all slow
    st = learned.stats()
    assert (st.timeout_percentile, st.timeout_fallback_from) == (90.0, 80.0)
