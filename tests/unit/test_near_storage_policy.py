"""SOPHON's decision engine (planner/near_storage.py) on synthetic per-sample profiles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headrace.planner import near_storage as ns

MB = 1e6


def profile(rows: list[tuple[list[float], list[float]]]) -> ns.SampleProfile:
    """rows: (sizes after each step, CPU seconds of each step) per sample."""
    return ns.SampleProfile(np.array([r[0] for r in rows], float),
                            np.array([r[1] for r in rows], float))


def openimages_like(n: int = 400, seed: int = 0) -> ns.SampleProfile:
    """load (raw jpeg) -> decode (inflates 8x) -> crop (224x224x3) -> to float (x4)."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(np.log(300e3), 0.8, n)
    crop = np.full(n, 224 * 224 * 3.0)
    sizes = np.stack([raw, raw * 8, crop, crop * 4], axis=1)
    cpu = np.stack([np.full(n, 1e-4), raw / 50e6, np.full(n, 2e-3), np.full(n, 1e-3)], axis=1)
    return ns.SampleProfile(sizes, cpu)


def test_never_offloads_a_sample_that_is_smallest_raw() -> None:
    small = ([100e3, 800e3, 150e3, 600e3], [0.0, 1e-3, 1e-3, 1e-3])  # raw is the minimum
    big = ([900e3, 7e6, 150e3, 600e3], [0.0, 5e-3, 1e-3, 1e-3])  # crop is the minimum
    prof = profile([small, big] * 50)
    res = ns.Resources(bandwidth=1 * MB, storage_cores=64, compute_cores=8)
    plan = ns.sophon(prof, res)
    assert (plan.stops[0::2] == 1).all()  # the small ones go raw
    assert (plan.stops[1::2] == 3).all()  # the big ones stop after the crop (smallest form)
    assert plan.offloaded == 50
    assert plan.predicted.bytes == pytest.approx(50 * 100e3 + 50 * 150e3)


def test_ties_keep_the_shorter_prefix() -> None:
    prof = profile([([100.0, 100.0, 100.0], [0.0, 1.0, 1.0])])
    stops, saved, _ = ns.best_prefixes(prof)
    assert stops[0] == 1 and saved[0] == 0
    assert ns.sophon(prof, ns.Resources(1.0, 1, 1)).offloaded == 0


def test_takes_samples_in_decreasing_efficiency() -> None:
    # same saving, different CPU: with room for only some, the cheap ones go first
    cheap = ([1e6, 1e5], [0.0, 0.01])
    dear = ([1e6, 1e5], [0.0, 0.10])
    prof = profile([dear, cheap] * 20)
    # network 40 MB / 10 MB/s = 4 s; one storage core: 20 cheap = 0.2 s, then the dear ones
    # add 0.1 s each while the network drops 0.09 s each
    plan = ns.sophon(prof, ns.Resources(bandwidth=10 * MB, storage_cores=1, compute_cores=4))
    assert (plan.stops[1::2] == 2).all()
    taken_dear = int((plan.stops[0::2] == 2).sum())
    assert 0 < taken_dear < 20


def test_stops_when_storage_cpu_becomes_the_bottleneck() -> None:
    prof = openimages_like()
    fast_link = ns.Resources(bandwidth=1e3 * MB, storage_cores=1, compute_cores=16)
    slow_link = ns.Resources(bandwidth=100 * MB, storage_cores=1, compute_cores=16)
    plenty = ns.Resources(bandwidth=100 * MB, storage_cores=64, compute_cores=16)
    none = ns.sophon(prof, fast_link)
    assert none.offloaded == 0 and "not the bottleneck" in none.reason
    some = ns.sophon(prof, slow_link)
    shrinkers = int((ns.best_prefixes(prof)[1] > 0).sum())
    assert 0 < some.offloaded < shrinkers
    # it stopped where storage CPU caught up with the network, within one sample's work
    _, _, cost = ns.best_prefixes(prof)
    p = some.predicted
    assert p.storage_s >= p.net_s - cost.max() / slow_link.storage_cores - 1e-9
    assert p.storage_s <= p.net_s + cost.max() + 1e-9
    # with ample storage cores every sample that shrinks is offloaded
    all_of_them = ns.sophon(prof, plenty)
    assert all_of_them.offloaded == shrinkers
    # and never predicts a longer epoch than any comparison policy
    for res in (fast_link, slow_link, plenty):
        best = ns.sophon(prof, res).predicted.epoch_s
        others = [ns.no_off(prof, res), ns.all_off(prof, res), ns.fastflow(prof, res),
                  ns.prefix_off(prof, res, 3)]
        assert best <= min(o.predicted.epoch_s for o in others) + 1e-9


def test_comparison_policies_from_the_same_profile() -> None:
    prof = openimages_like()
    res = ns.Resources(bandwidth=10 * MB, storage_cores=4, compute_cores=16)
    sizes = prof.sizes
    assert ns.no_off(prof, res).predicted.bytes == pytest.approx(sizes[:, 0].sum())
    assert ns.all_off(prof, res).predicted.bytes == pytest.approx(sizes[:, -1].sum())
    resize = ns.decide("resize-off", prof, res, resize_stop=3)
    assert (resize.stops == 3).all() and resize.offloaded == len(sizes)
    assert resize.predicted.bytes == pytest.approx(sizes[:, 2].sum())
    # all-off sends floats: more bytes than raw, so all-or-nothing keeps everything local
    ff = ns.fastflow(prof, res)
    assert ff.policy == "fastflow" and ff.offloaded == 0
    # ...unless the floats are smaller than raw for every sample
    shrink = ns.SampleProfile(prof.sizes * np.array([1, 1, 1, 0.01]), prof.cpu)
    assert ns.fastflow(shrink, res).offloaded == len(sizes)
    with pytest.raises(ValueError, match="resize_stop"):
        ns.decide("resize-off", prof, res)
    with pytest.raises(ValueError, match="unknown"):
        ns.decide("sometimes", prof, res)


def test_traffic_reduction_beats_resize_off_on_a_mixed_set() -> None:
    prof = openimages_like()
    res = ns.Resources(bandwidth=10 * MB, storage_cores=64, compute_cores=16)
    raw = ns.no_off(prof, res).predicted.bytes
    h = ns.sophon(prof, res).predicted.bytes
    r = ns.prefix_off(prof, res, 3).predicted.bytes
    assert h < r and h < raw


def test_unmeasured_samples_go_raw_and_count_as_the_mean() -> None:
    prof = openimages_like(10)
    sizes = prof.sizes.copy()
    sizes[3, 2] = math.nan
    holes = ns.SampleProfile(sizes, prof.cpu)
    plan = ns.sophon(holes, ns.Resources(bandwidth=1 * MB, storage_cores=64, compute_cores=4))
    assert plan.stops[3] == 1
    filled, _, known = holes.filled()
    assert not known[3] and filled[3, 0] == pytest.approx(np.delete(prof.sizes[:, 0], 3).mean())


def test_gpu_bound_job_offloads_nothing() -> None:
    prof = openimages_like()
    res = ns.Resources(bandwidth=10 * MB, storage_cores=64, compute_cores=16, gpu_s=1e4)
    assert ns.sophon(prof, res).offloaded == 0


def test_stage_one_io_bound() -> None:
    assert ns.io_bound(net_thp=50, cpu_thp=400, gthp=300)[0]
    ok, why = ns.io_bound(net_thp=500, cpu_thp=400)
    assert not ok and "CPU" in why
    assert not ns.io_bound(net_thp=500, cpu_thp=800, gthp=100)[0]


def test_describe_names_the_numbers() -> None:
    prof = openimages_like(20)
    text = ns.sophon(prof, ns.Resources(1 * MB, 2, 4)).describe()
    assert "offloaded" in text and "MB" in text and "bound:" in text


def test_a_sample_refused_by_the_guard_does_not_stop_the_cheaper_ones_after_it() -> None:
    """SOPHON §3.2 goes on while the network is predominant; headrace's guard leaves a sample
    raw when its storage CPU would outlast the network, and the greedy used to stop there:
    sample 2 (cheaper, network still the bound) was never tried (3.50 s, not 3.45 s)."""
    prof = profile([([1e6, 0.5e6], [0.0, 0.01]),  # 50 MB per CPU-second: taken first
                    ([1e6, 0.1e6], [0.0, 5.0]),  # 0.18: storage CPU 5 s > network 3.5 s
                    ([1e6, 0.95e6], [0.0, 0.5]),  # 0.1: fits under the network time
                    ([1e6, 1.2e6], [0.0, 0.01])])  # never smaller than raw
    plan = ns.sophon(prof, ns.Resources(bandwidth=1 * MB, storage_cores=1, compute_cores=4))
    assert plan.stops.tolist() == [2, 1, 2, 1]
    assert plan.predicted.epoch_s == pytest.approx(3.45)
    assert plan.predicted.bottleneck == "network"
    assert "still the bottleneck" in plan.reason and "1 of 3 samples that shrink left raw" \
        in plan.reason


def test_the_reason_follows_what_ended_the_greedy() -> None:
    # the only sample that shrinks costs 5 s of storage CPU against 2 s of network: left raw,
    # and the network still the bound (it said "the network is not the bottleneck")
    prof = profile([([1e6, 0.1e6], [0.0, 5.0]), ([1e6, 1.2e6], [0.0, 0.01])])
    plan = ns.sophon(prof, ns.Resources(bandwidth=1 * MB, storage_cores=1, compute_cores=4))
    assert plan.offloaded == 0 and plan.predicted.bottleneck == "network"
    assert "not the bottleneck" not in plan.reason and "left raw" in plan.reason
    # a fast link: training CPU is the bound from the start, and the reason says by how much
    none = ns.sophon(openimages_like(), ns.Resources(bandwidth=1e3 * MB, storage_cores=1,
                                                     compute_cores=16))
    assert none.offloaded == 0 and none.predicted.bottleneck == "training CPU"
    assert "the network is not the bottleneck (training CPU" in none.reason
