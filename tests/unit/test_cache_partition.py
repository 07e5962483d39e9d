"""MDP (Seneca §5.1) on synthetic numbers."""

from __future__ import annotations

import math

import pytest

from headrace.planner.cache_partition import (
    DsiParams,
    best_split,
    cached_counts,
    consumer_rate,
    dsi_augmented,
    dsi_decoded,
    dsi_encoded,
    dsi_overall,
    dsi_storage,
    kept_split,
    single_tier_splits,
)

KB, MB, GB = 1e3, 1e6, 1e9


def params(**kw) -> DsiParams:
    """ImageNet-like: 110 KB JPEGs inflated 5.12x (the paper's M), 1M samples."""
    base = dict(n_total=1_000_000, cache_bytes=64 * GB, size_encoded=110 * KB,
                size_decoded=5.12 * 110 * KB, size_augmented=5.12 * 110 * KB,
                t_decode_augment=1500.0, t_augment=6000.0, t_gpu=8000.0, b_cache=10 * GB,
                b_storage=500 * MB, b_nic=1.25 * GB, b_pcie=16 * GB)
    base.update(kw)
    return DsiParams(**base)


def test_equations_by_hand() -> None:
    p = params()
    m_s = 5.12 * 110 * KB
    assert dsi_augmented(p) == pytest.approx(min(10 * GB / m_s, 1.25 * GB / m_s, 16 * GB / m_s, 8000))
    assert dsi_decoded(p) == pytest.approx(min(dsi_augmented(p), 6000))
    assert dsi_encoded(p) == pytest.approx(min(1.25 * GB / (110 * KB), 1500))
    assert dsi_storage(p) == pytest.approx(min(dsi_encoded(p), 500 * MB / (110 * KB)))
    # Equations 2, 4, 6, 8: half the cache augmented, the rest encoded
    n_a, n_d, n_e, n_s = cached_counts(p, 0.5, 0.0, 0.5)
    assert n_a == pytest.approx(32 * GB / m_s) and n_d == 0
    assert n_e == pytest.approx(min(1e6 - n_a, 32 * GB / (110 * KB)))
    assert n_a + n_d + n_e + n_s == pytest.approx(1e6)
    want = (n_a * dsi_augmented(p) + n_e * dsi_encoded(p) + n_s * dsi_storage(p)) / 1e6
    assert dsi_overall(p, 0.5, 0.0, 0.5) == pytest.approx(want)


def test_cpu_bound_with_a_large_cache_prefers_processed_forms() -> None:
    # everything fits augmented: no CPU work at all is best (the accelerator is the limit)
    p = params(cache_bytes=10_000 * GB, b_nic=math.inf)
    s = best_split(p)
    assert cached_counts(p, s.encoded, s.decoded, s.augmented)[0] == p.n_total
    assert s.predicted == pytest.approx(dsi_augmented(p)) == pytest.approx(8000)
    # augmented not allowed (one job, per-epoch randomness): every sample decoded
    s = best_split(p, ("encoded", "decoded"))
    assert cached_counts(p, s.encoded, s.decoded, 0.0)[1] == p.n_total
    assert s.predicted == pytest.approx(6000)  # T_A


def test_a_small_cache_holds_more_samples_encoded() -> None:
    # the cache holds 5% of the dataset encoded; storage is slow: encoded wins by count
    p = params(cache_bytes=5.5 * GB, b_storage=50 * MB, t_decode_augment=3000)
    s = best_split(p)
    assert s.encoded == 1.0
    singles = {x.describe().split(" ")[0]: x.predicted for x in single_tier_splits(p, ("encoded", "decoded", "augmented"))}
    assert singles["encoded"] > singles["decoded"]


def test_mixed_split_beats_every_single_form() -> None:
    # decoded saves CPU, encoded holds 5x more samples: the best keeps every sample cached,
    # as many decoded as room allows (a corner of the linear model is not always best)
    p = params(n_total=100_000, cache_bytes=25 * GB, size_decoded=550 * KB,
               b_storage=40 * MB, t_decode_augment=2500, t_augment=5000, b_nic=math.inf)
    s = best_split(p, ("encoded", "decoded"))
    assert 0 < s.encoded < 1 and 0 < s.decoded < 1
    for single in single_tier_splits(p, ("encoded", "decoded")):
        assert s.predicted > single.predicted
    assert s.predicted == pytest.approx(dsi_overall(p, s.encoded, s.decoded, 0.0))


def test_the_accelerator_caps_every_prediction() -> None:
    p = params(t_gpu=100.0, cache_bytes=10_000 * GB)
    assert best_split(p).predicted == pytest.approx(100.0)


def test_the_training_loops_own_rate_is_t_gpu() -> None:
    # 2,000 samples in 12 s, 2 of them waiting inside next(): 200 samples/s of its own time
    assert consumer_rate(2000, 12.0, 2.0) == pytest.approx(200.0)
    assert consumer_rate(0, 12.0, 2.0) == math.inf  # nothing measured: no limit
    assert consumer_rate(100, 3.0, 3.0) == math.inf  # it only waited: unknown, no limit


def test_a_measured_accelerator_brings_predictions_down_to_it() -> None:
    # at small scale the CPU side is fast (a tiny pipeline): without T_GPU every split
    # predicts thousands of samples/s; the measured training loop takes 200
    fast_cpu = dict(n_total=1000, cache_bytes=50 * MB, t_decode_augment=5000.0,
                    t_augment=20_000.0, b_nic=math.inf, b_pcie=math.inf)
    unlimited = params(t_gpu=math.inf, **fast_cpu)
    measured = params(t_gpu=consumer_rate(2000, 12.0, 2.0), **fast_cpu)
    forms = ("encoded", "decoded")
    assert best_split(unlimited, forms).predicted > 4000
    assert best_split(measured, forms).predicted == pytest.approx(200.0)
    for s in single_tier_splits(measured, forms):  # every split is capped by the accelerator
        assert s.predicted <= 200.0 + 1e-9
    # an accelerator between the single forms' bounds separates them as Equations 3 and 5 do
    mid = params(t_gpu=8000.0, **fast_cpu)
    preds = {round(s.decoded): s.predicted for s in single_tier_splits(mid, forms)}
    assert preds[1] > preds[0]  # decoded (T_A 20,000 capped at 8,000) beats encoded (5,000)


def test_no_budget_caches_nothing_and_says_so() -> None:
    # every split ties at 0 bytes: the tie-break named "decoded 100%" for a cache holding none
    p = params(cache_bytes=0.0)
    s = best_split(p)
    assert s.shares() == {} and s.predicted == pytest.approx(dsi_storage(p))
    assert s.describe() == f"nothing cached: {dsi_storage(p):.0f} samples/s predicted"
    assert single_tier_splits(p, ("encoded", "decoded")) == []


def test_the_last_epochs_split_is_kept_unless_the_best_is_predicted_enough_faster() -> None:
    """A switch drops what the last epoch stored, and predictions move by a few percent
    between epochs: MDP's best replaces the last split only when predicted more than
    ``SWITCH_GAIN`` (5%) faster than it, on the same numbers."""
    p = params(cache_bytes=5.5 * GB, b_storage=50 * MB, t_decode_augment=3000)
    forms = ("encoded", "decoded")
    best = best_split(p, forms)
    assert best.shares() == {"encoded": 1.0}  # as test_a_small_cache_holds_more_samples_encoded
    near = {"encoded": 0.9, "decoded": 0.1}  # predicted 2% slower than the best
    kept = kept_split(p, best, near, forms)
    assert kept is not None and kept.shares() == near
    assert kept.predicted == pytest.approx(dsi_overall(p, 0.9, 0.1, 0.0))
    assert best.predicted / kept.predicted == pytest.approx(1.019, abs=0.001)
    assert kept_split(p, best, {"decoded": 1.0}, forms) is None  # the best is 23% faster
    assert kept_split(p, best, {}, forms) is None  # no last split
    assert kept_split(p, best, {"augmented": 1.0}, forms) is None  # a form not allowed now
    assert kept_split(p, best, best.shares(), forms) == best


def test_a_shared_augmented_share_over_the_best_goes_to_the_exact_form_kept() -> None:
    """A shared augmented entry is served once and dropped: nothing of it to keep. Where
    every split ties (a training loop slower than all of them) the default's half augmented
    stayed for good, where MDP's tie-break gives it none; refusing the keep instead dropped
    the decoded entries for a best predicted 3% faster (reviews)."""
    forms = ("encoded", "decoded", "augmented")
    default = {"decoded": 0.5, "augmented": 0.5}  # the default split with shared_augmented
    tie = params(t_gpu=100.0, cache_bytes=10_000 * GB)
    best = best_split(tie, forms)
    assert best.augmented == 0 and best.predicted == pytest.approx(100.0)
    kept = kept_split(tie, best, default, forms)
    assert kept is not None and kept.shares() == {"decoded": 1.0}
    near = params(cache_bytes=20 * GB, t_gpu=3000.0, b_storage=100 * MB, b_nic=math.inf)
    best = best_split(near, forms)
    assert best.shares() == {"encoded": 1.0}
    kept = kept_split(near, best, default, forms)
    assert kept is not None and kept.shares() == {"decoded": 1.0}
    assert best.predicted / kept.predicted == pytest.approx(1.034, abs=0.001)
    assert kept_split(near, best, {"augmented": 1.0}, forms) is None  # no exact form kept
