"""Streaming statistics and the profile report (profiler/stats.py, profiler/report.py)."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle

import numpy as np
import pytest

from headrace.pipeline.runner import StepTiming
from headrace.profiler.report import PROFILE_SCHEMA, TOTAL_GRID
from headrace.profiler.stats import (
    TIMES_ALL,
    TIMES_EVERY,
    Moments,
    PipelineProfile,
    Profiler,
    Quantiles,
)

NAMES = ["load", "decode", "crop", "flip"]


def sample(walls, cpus=None):
    cpus = cpus if cpus is not None else [w / 2 for w in walls]
    return [StepTiming(i, w, c) for i, (w, c) in enumerate(zip(walls, cpus, strict=True))]


# -- Moments and Quantiles --------------------------------------------------------------------


def test_moments_match_numpy_whichever_way_values_arrive():
    x = np.random.default_rng(0).normal(3.0, 2.0, 1000)
    one, batch, merged, other = Moments(), Moments(), Moments(), Moments()
    for v in x:
        one.add(float(v))
    batch.add_many(x[:300])
    batch.add_many(x[300:])
    merged.add_many(x[:700])
    other.add_many(x[700:])
    merged.merge(other)
    for m in (one, batch, merged):
        assert m.count == 1000
        assert m.mean == pytest.approx(x.mean(), rel=1e-12)
        assert m.std == pytest.approx(x.std(), rel=1e-9)
        assert (m.min, m.max) == (x.min(), x.max())


def test_quantiles_are_exact_below_capacity():
    x = np.random.default_rng(1).exponential(size=500)
    q = Quantiles(capacity=512)
    q.add_many(x[:200])
    for v in x[200:]:
        q.add(float(v))
    for p in (0.1, 0.5, 0.9, 0.99):
        assert q.quantile(p) == pytest.approx(np.quantile(x, p))
    assert q.quantile(0.0) == x.min() and q.quantile(1.0) == x.max()


@pytest.mark.parametrize("batched", [False, True])
def test_reservoir_is_bounded_and_uniform_over_the_stream(batched):
    n, k = 100_000, 2048
    x = np.arange(n, dtype=np.float64)  # value = arrival position: bias would show
    q = Quantiles(capacity=k, seed=3)
    if batched:
        for i in range(0, n, 256):
            q.add_many(x[i : i + 256])
    else:
        for v in x.tolist():
            q.add(v)
    kept = q._values()
    assert len(kept) == k and len(set(kept.tolist())) == k
    assert q.count == n and q.mean == pytest.approx((n - 1) / 2)
    # a uniform sample of positions: half from each half of the stream, quantiles near truth
    assert abs((kept >= n / 2).mean() - 0.5) < 0.05
    for p in (0.1, 0.5, 0.9):
        assert abs(q.quantile(p) / n - p) < 0.03


def test_quantiles_are_deterministic_for_a_seed():
    x = np.random.default_rng(2).random(10_000)
    a, b = Quantiles(256, seed=7), Quantiles(256, seed=7)
    a.add_many(x)
    b.add_many(x)
    assert np.array_equal(a._values(), b._values())


def test_merge_weights_each_stream_by_its_count():
    a, b = Quantiles(1024, seed=1), Quantiles(1024, seed=2)
    a.add_many(np.zeros(10_000))
    b.add_many(np.ones(30_000))
    a.merge(b)
    assert a.count == 40_000 and a.mean == pytest.approx(0.75)
    assert len(a._values()) == 1024
    assert abs(a._values().mean() - 0.75) < 0.05
    assert a.quantile(0.1) == 0.0 and a.quantile(0.5) == 1.0


def test_merge_of_small_streams_keeps_everything():
    a, b = Quantiles(100), Quantiles(100)
    a.add_many(np.arange(10.0))
    b.add_many(np.arange(10.0, 30.0))
    a.merge(b)
    assert sorted(a._values().tolist()) == list(np.arange(30.0))


def test_non_finite_values_are_ignored_and_empty_is_nan():
    q = Quantiles(16)
    assert math.isnan(q.quantile(0.5))
    q.add(math.nan)
    q.add_many(np.array([math.inf, 1.0, 3.0]))
    assert q.count == 2 and q.quantile(0.5) == 2.0


# -- Profiler ---------------------------------------------------------------------------------


def feed_known(prof, n=100):
    """decode inflates 10x, crop halves the bytes on average (0.25..0.75), flip is neutral."""
    rng = np.random.default_rng(0)
    for i in range(n):
        raw = 1000 + 10 * i
        decoded = 10 * raw
        cropped = int(decoded * rng.uniform(0.25, 0.75))
        prof.observe(
            sample([0.001, 0.004, 0.002, 0.0005 + i * 1e-5]), [raw, decoded, cropped, cropped]
        )


def test_report_per_step_numbers():
    prof = Profiler(NAMES)
    feed_known(prof)
    rep = prof.report()
    assert rep.samples == 100 and rep.step_names == NAMES
    load, decode, crop, flip = rep.steps
    assert load.bytes_in_mean == 0 and load.inflation is None and load.inflation_mean is None
    assert decode.inflation == pytest.approx(10.0) and decode.inflation_std == pytest.approx(0.0)
    assert 0.4 < crop.inflation < 0.6 and crop.inflation == pytest.approx(
        crop.bytes_out_mean / crop.bytes_in_mean
    )
    assert crop.inflation_p10 < 0.35 and crop.inflation_p90 > 0.65  # the spread across samples
    assert flip.inflation == pytest.approx(1.0)
    assert decode.wall_p50 == pytest.approx(0.004) and decode.cpu_mean == pytest.approx(0.002)
    assert flip.wall_p90 == pytest.approx(np.quantile(0.0005 + np.arange(100) * 1e-5, 0.9))
    assert all(s.count == 100 for s in rep.steps)
    totals = 0.0075 + np.arange(100) * 1e-5
    assert rep.total_mean == pytest.approx(totals.mean())
    assert len(rep.total_quantiles) == TOTAL_GRID
    assert rep.total_p50 == pytest.approx(np.quantile(totals, 0.5))
    assert rep.total_p90 == pytest.approx(np.quantile(totals, 0.9))
    assert rep.total_max == pytest.approx(totals.max())


def test_batching_does_not_change_the_result():
    a, b = Profiler(NAMES, batch=1), Profiler(NAMES, batch=1000)
    feed_known(a)
    feed_known(b)
    assert b.samples == 100  # pending samples are counted before they are folded in
    ra, rb = a.report(), b.report()
    for sa, sb in zip(ra.steps, rb.steps, strict=True):
        for f in dataclasses.fields(sa):
            va, vb = getattr(sa, f.name), getattr(sb, f.name)
            assert va == (pytest.approx(vb, rel=1e-9) if isinstance(vb, float) else vb), f.name
    assert ra.total_quantiles == pytest.approx(rb.total_quantiles, rel=1e-12)
    assert ra.total_mean == pytest.approx(rb.total_mean, rel=1e-12)


def test_partial_segments_and_cache_hits_count_for_their_steps():
    prof = Profiler(NAMES)
    # a sample whose load+decode came from a cache: starts at crop with its input size
    prof.observe([StepTiming(2, 0.002, 0.001), StepTiming(3, 0.001, 0.001)], [50, 50], bytes_in=100)
    # a sample handed to the slow lane after decode, observed in two segments
    prof.observe(sample([0.001, 0.5]), [10, 100], partial=True)
    prof.observe([StepTiming(2, 0.002, 0.001), StepTiming(3, 0.001, 0.001)], [50, 50],
                 bytes_in=100, total=0.504)  # fmt: skip
    rep = prof.report()
    assert rep.samples == 2
    assert [s.count for s in rep.steps] == [1, 1, 2, 2]
    assert rep.step("crop").inflation == pytest.approx(0.5)
    assert rep.total_max == pytest.approx(0.504)
    assert rep.total_quantile(0.0) == pytest.approx(0.003)


@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_samples_without_sizes_count_for_their_times_not_their_sizes(batch):
    """A worker measures sizes on some samples (its first 64, then one in 8) and times on all:
    every sample counts for the times and ``samples``; sizes, run-queue waits and type changes
    come from the sized ones alone (an unsized record's ``queued`` reads 0, not measured)."""
    prof = Profiler(NAMES, batch=batch)
    for i in range(10):  # sized: crop halves, 1 ms of decode's wall waited for a core
        prof.observe([StepTiming(k, 0.004, 0.002, 0, k == 1, 0.001 * (k == 1)) for k in range(4)],
                     [100, 1000, 500, 500], changes_type=[False, i == 0, False, False])
    for _ in range(30):  # times alone, twice as long
        prof.observe([StepTiming(k, 0.008, 0.004) for k in range(4)], None, total=0.032)
    prof.observe(sample([0.008, 0.008]), None, partial=True)  # a slow-lane segment, then its end
    prof.observe([StepTiming(2, 0.008, 0.004), StepTiming(3, 0.008, 0.004)], None, total=0.032)
    assert prof.samples == 41
    rep = prof.report()
    assert rep.samples == 41 and rep.sized_samples == 10
    assert [(s.count, s.sized) for s in rep.steps] == [(41, 10)] * 4
    decode, crop = rep.step("decode"), rep.step("crop")
    assert decode.wall_mean == pytest.approx((10 * 0.004 + 31 * 0.008) / 41)
    assert decode.cpu_mean == pytest.approx((10 * 0.002 + 31 * 0.004) / 41)
    assert decode.queued_mean == pytest.approx(0.001)
    assert (decode.bytes_in_mean, decode.bytes_out_mean, decode.inflation) == (100, 1000, 10.0)
    assert crop.inflation == pytest.approx(0.5) and crop.inflation_std == 0.0
    assert decode.type_changes == 1
    assert rep.total_quantile(0.0) == pytest.approx(0.016)
    assert rep.total_max == pytest.approx(0.032) and rep.total_p50 == pytest.approx(0.032)


def test_records_without_sizes_are_all_kept_until_the_profile_is_full_then_one_in_every():
    """The training process's cost of the time-only records is bounded in the long run; a
    record with sizes is always kept."""
    prof = Profiler(NAMES)
    times = [StepTiming(k, 0.001, 0.001) for k in range(4)]
    for _ in range(TIMES_ALL):
        prof.observe(times, None)
    assert prof.samples == TIMES_ALL
    for _ in range(10 * TIMES_EVERY):
        prof.observe(times, None)
        prof.observe(times, [1, 1, 1, 1])
    assert prof.samples == TIMES_ALL + 10 + 10 * TIMES_EVERY
    rep = prof.report()
    assert rep.sized_samples == 10 * TIMES_EVERY and rep.samples == prof.samples


def test_a_profile_without_sized_counts_reads_every_observed_sample_as_sized():
    """Profiles stored before ``StepStats.sized`` existed sized every sample they observed."""
    prof = Profiler(NAMES)
    feed_known(prof, 20)
    d = prof.report().to_dict()
    for s in d["steps"]:
        del s["sized"]
    old = PipelineProfile.from_dict(d)
    assert old.samples == old.sized_samples == 20
    assert all(s.sized is None for s in old.steps)


def test_type_changes_are_counted_per_step():
    prof = Profiler(NAMES)
    for _ in range(3):
        prof.observe(sample([0.1] * 4), [1, 2, 2, 2], changes_type=[True, True, False, False])
    rep = prof.report()
    assert rep.step("decode").changes_type and rep.step("decode").type_changes == 3
    assert not rep.step("crop").changes_type


def test_observe_rejects_misaligned_records():
    prof = Profiler(NAMES)
    with pytest.raises(ValueError, match="align"):
        prof.observe(sample([0.1] * 4), [1, 2, 3])
    with pytest.raises(ValueError, match="align"):
        prof.observe(sample([0.1] * 4), [1, 2, 3, 4], changes_type=[True])
    with pytest.raises(ValueError, match="outside"):
        prof.observe([StepTiming(7, 0.1, 0.1)], [1])


def test_profilers_merge():
    a, b, both = Profiler(NAMES), Profiler(NAMES, seed=9), Profiler(NAMES)
    feed_known(a, 60)
    feed_known(b, 40)
    feed_known(both, 60)
    feed_known(both, 40)
    a.merge(b)
    ra, rb = a.report(), both.report()
    assert ra.samples == 100
    assert ra.step("crop").bytes_in_mean == pytest.approx(rb.step("crop").bytes_in_mean)
    assert ra.total_p90 == pytest.approx(rb.total_p90)
    with pytest.raises(ValueError):
        a.merge(Profiler(["load", "other"]))


def test_profiler_pickles_with_its_state():
    prof = Profiler(NAMES)
    feed_known(prof, 10)
    assert pickle.loads(pickle.dumps(prof)).report() == prof.report()


def test_empty_report():
    rep = Profiler(NAMES).report()
    assert rep.samples == 0 and rep.total_quantiles == ()
    assert all(s.count == 0 and s.inflation is None for s in rep.steps)
    assert math.isnan(rep.total_p50)


def test_profile_round_trips_through_json():
    prof = Profiler(NAMES)
    feed_known(prof)
    rep = prof.report()
    text = json.dumps(rep.to_dict(), allow_nan=False)
    back = PipelineProfile.from_dict(json.loads(text))
    assert back == rep
    assert back.step("crop").inflation_p10 == rep.step("crop").inflation_p10
    with pytest.raises(KeyError):
        rep.step("nope")


def test_the_executor_that_measured_a_profile_is_kept():
    prof = Profiler(NAMES, executor="threads")
    feed_known(prof)
    rep = prof.report()
    assert rep.executor == "threads"
    assert PipelineProfile.from_dict(json.loads(json.dumps(rep.to_dict()))).executor == "threads"
    # stored before the field existed: not known
    old = {k: v for k, v in rep.to_dict().items() if k != "executor"}
    assert PipelineProfile.from_dict(old).executor is None


def test_from_dict_refuses_other_schemas_and_malformed_dicts():
    d = Profiler(NAMES).report().to_dict()
    with pytest.raises(ValueError, match="schema"):
        PipelineProfile.from_dict({**d, "schema_version": PROFILE_SCHEMA + 1})
    with pytest.raises(ValueError, match="malformed"):
        PipelineProfile.from_dict({**d, "steps": [{"name": "x"}]})


def test_step_medians_are_the_reports_including_a_step_not_yet_observed():
    p = Profiler(NAMES)
    rng = np.random.default_rng(3)
    for _ in range(3 * TIMES_ALL):  # past the reservoir, records kept one in TIMES_EVERY
        p.observe(sample(list(rng.random(3)) + [0.0])[:3], None, partial=True)
    for _ in range(50):
        p.observe(sample(list(rng.random(4))), [10, 20, 30, 40])
    assert p.step_wall_p50s() == [s.wall_p50 for s in p.report().steps]
    fresh = Profiler(NAMES)
    fresh.observe(sample([0.5, 0.25])[:2], None, partial=True)
    assert fresh.step_wall_p50s() == [0.5, 0.25, 0.0, 0.0] == [
        s.wall_p50 for s in fresh.report().steps]
