"""FastFlow's smart offloading policy (planner/offload.py) on synthetic profiles."""

import math

import pytest

from headrace.planner.offload import (
    OffloadInputs,
    StepCost,
    candidates,
    decide,
    local_bound,
    probe_link_bound,
    worker_rate,
)

MB = 1e6


def profile(load_cpu=0.001, prep_cpu=0.020, raw=0.1 * MB, decoded=0.6 * MB, out=0.6 * MB):
    return (StepCost("load", load_cpu, raw), StepCost("decode", prep_cpu / 2, decoded),
            StepCost("augment", prep_cpu / 2, out))


def inputs(**kw):
    base = dict(gthp=400.0, lthp=100.0, steps=profile(), remote_workers=8,
                bandwidth=1000 * MB, overhead_s=0.0005)
    base.update(kw)
    return OffloadInputs(**base)


def test_no_stall_no_offload():
    d = decide(inputs(gthp=100.0, lthp=100.0))
    assert not d.offload and "no stall" in d.reason
    d = decide(inputs(gthp=105.0, lthp=100.0))  # a 5% gain is under the 10% threshold
    assert not d.offload and d.ratio == 0.0


def test_no_remote_worker_no_offload():
    assert not decide(inputs(remote_workers=0)).offload


def test_cpu_bound_offloads_a_large_share():
    d = decide(inputs(bandwidth=10_000 * MB, remote_workers=16))
    assert d.offload
    assert d.ratio >= 0.7
    assert d.best is not None and d.best.stop == 3  # the whole CPU-heavy part runs remotely
    assert d.predicted > 1.1 * d.lthp


def test_network_bound_offloads_a_small_share():
    # 10 MB/s to the remote nodes; a sample moves >= 0.6 MB back: at most ~16 samples/s
    d = decide(inputs(bandwidth=10 * MB))
    assert d.offload
    assert d.ratio < 0.2
    assert d.lower > d.upper  # a bottleneck either way: balanced by capacity (line 13)
    assert d.ratio == pytest.approx(d.best.rthp / (d.lthp + d.best.rthp))


def test_split_point_follows_the_bytes():
    # decode inflates 0.1 MB to 6 MB and augment shrinks it to 0.1 MB: with a slow network the
    # best range keeps decode and augment together remotely (ship 0.1 MB, get 0.1 MB back),
    # never stopping after decode (6 MB back)
    steps = profile(raw=0.1 * MB, decoded=6 * MB, out=0.1 * MB)
    d = decide(inputs(steps=steps, bandwidth=50 * MB))
    assert d.offload and d.best.stop == 3
    cands = {(c.start, c.stop): c for c in candidates(inputs(steps=steps, bandwidth=50 * MB))}
    assert cands[(0, 2)].rthp < cands[(0, 3)].rthp


def test_slow_remote_probe_lowers_remote_throughput():
    fast = candidates(inputs())
    slow = candidates(inputs(remote_thp=50.0))  # the probe saw remote workers deliver 50/s
    assert all(s.rthp <= f.rthp for s, f in zip(slow, fast, strict=True))
    full = next(c for c in slow if (c.start, c.stop) == (0, 3))
    assert full.rthp == pytest.approx(50.0)


def test_unknown_accelerator_bound_balances_by_capacity():
    d = decide(inputs(gthp=math.inf))
    assert d.offload and 0 < d.ratio < 1
    assert d.ratio == pytest.approx(d.best.rthp / (d.lthp + d.best.rthp))
    assert "ratio" in d.describe() and "Lower" in d.describe()


def test_workers_needed():
    d = decide(inputs(bandwidth=10_000 * MB, remote_workers=16))
    n = d.workers_needed(per_worker_thp=25.0, available=16)
    assert 1 <= n <= 16
    assert n == min(16, math.ceil(d.ratio * d.predicted / 25.0))
    assert decide(inputs(gthp=100.0)).workers_needed(25.0, 16) == 0


def test_a_link_bound_probe_sizes_workers_by_cpu():
    # 10 MB/s, 0.6 MB per finished sample: the link carries ~16.7 samples/s, and the probe's
    # 8 workers delivered 16 together: the link, not their CPUs, set that number
    x = inputs(bandwidth=10 * MB, remote_thp=16.0)
    assert probe_link_bound(x)
    d = decide(x)
    assert d.offload and d.ratio < 0.2
    rate = worker_rate(x, d)
    assert rate == pytest.approx(1 / sum(s.work_s for s in x.steps[d.best.start:d.best.stop]))
    assert d.workers_needed(rate, 8) == 1  # not 8 workers at 2 samples/s each
    # the same total on a fast link: the workers' CPUs were slow, and the total says so
    cpu = inputs(bandwidth=10_000 * MB, remote_thp=16.0)
    assert not probe_link_bound(cpu)
    assert worker_rate(cpu, decide(cpu)) == pytest.approx(2.0)


def test_inputs_from_a_measured_profile():
    from headrace.planner.offload import inputs_from_profile
    from headrace.profiler.report import PipelineProfile, StepStats

    def st(name, cpu, out):
        return StepStats(name, 100, cpu, cpu, cpu, cpu, 0.0, out, None, None, None, None, None)

    prof = PipelineProfile((st("load", 0.001, 1e5), st("decode", 0.01, 6e5)), 100, 0.011, 0.02,
                           ())
    x = inputs_from_profile(prof, gthp=400.0, lthp=90.0, remote_workers=4)
    assert [s.name for s in x.steps] == ["load", "decode"]
    assert x.steps[1].work_s == 0.01 and x.steps[1].bytes_out == 6e5  # wall_mean
    assert decide(x).offload


# -- Remote(read_source=False): the remote nodes cannot reach the source (FastFlow's p'1) --

def unshared(**kw):
    steps = (StepCost("load", 0.001, 0.1 * MB), StepCost("decode", 0.010, 0.6 * MB),
             StepCost("crop", 0.004, 0.15 * MB))
    base = dict(gthp=1000.0, lthp=200.0, steps=steps, remote_workers=8, bandwidth=1250 * MB)
    base.update(kw)
    return OffloadInputs(**base)


def test_an_unreachable_source_leaves_only_ranges_this_host_reads():
    # the model ranks a = 0 highest (no local load, no bytes shipped out): with the source
    # shared it is chosen; when the user said the remote nodes cannot reach it, it must not be
    assert decide(unshared()).best.start == 0
    d = decide(unshared(read_source=False))
    assert d.offload and d.best.start == 1 and d.best.stop == 3
    assert {c.start for c in d.candidates} == {1}
    assert "this host reads the source" in d.describe()


def test_a_redecision_keeps_the_source_unreachable():
    from headrace.planner.replan import revise

    x = unshared(read_source=False)
    again = decide(revise(x, remote_workers=4, steps=tuple(
        StepCost(s.name, 2 * s.work_s, s.bytes_out) for s in x.steps)))
    assert again.offload and again.best.start == 1


def test_the_probe_ran_no_load_remotely_without_the_source():
    # with read_source=False the probe's 4 remote workers ran decode (10 ms) only, the load
    # was done here: 400 samples/s is exactly the profile's speed, not twice as fast
    from headrace.planner.offload import remote_speed

    steps = (StepCost("load", 0.010, 1e3), StepCost("decode", 0.010, 1e3))
    x = OffloadInputs(gthp=1000.0, lthp=50.0, steps=steps, remote_workers=4,
                      bandwidth=1000 * MB, remote_thp=400.0, read_source=False)
    assert remote_speed(x) == pytest.approx(1.0)
    # the loaded value crosses too: 40 kB shipped + 10 kB back at 20 MB/s carry 400/s
    big = OffloadInputs(gthp=1000.0, lthp=50.0, remote_workers=4, bandwidth=20 * MB,
                        remote_thp=400.0, read_source=False,
                        steps=(StepCost("load", 0.010, 40e3), StepCost("decode", 0.010, 10e3)))
    assert probe_link_bound(big)


def test_a_session_that_cannot_reach_the_source_keeps_reading_it_here():
    # whatever range a decision names, Remote(read_source=False) means this host loads
    import headrace as hr
    from headrace.remote.session import RemoteSession

    s = RemoteSession(hr.Remote(max_workers=8, read_source=False))
    s.max_workers = 8
    d = decide(unshared())  # decided as if the source were shared: a = 0
    assert d.best.start == 0 and s.read_local
    s.apply_offload(d, None, available=8)
    assert s.read_local and s.stop == d.best.stop


# -- FastFlow's rule assumes the local CPUs limit Lthp --

def test_idle_local_workers_are_not_offloaded_from():
    # CIFAR-sized samples: 0.2 ms of steps, 4 local workers, Lthp 3000/s set by the training
    # process: the steps keep 0.60 of 4 workers busy, so the stall is not theirs
    steps = (StepCost("load", 0.00005, 3e3), StepCost("aug", 0.00015, 12e3))
    x = OffloadInputs(gthp=10000.0, lthp=3000.0, steps=steps, remote_workers=8,
                      bandwidth=1250 * MB, overhead_s=0.0001, local_workers=4)
    d = decide(x)
    assert not d.offload and d.ratio == 0.0 and d.predicted == 3000.0
    assert "not the bottleneck" in d.reason and "0.60 of 4 busy (15%" in d.describe()
    # the same job with its 4 workers busy (Lthp 18000/s would keep 3.6 busy): offloaded
    busy = OffloadInputs(gthp=40000.0, lthp=18000.0, steps=steps, remote_workers=8,
                         bandwidth=1250 * MB, overhead_s=0.00001, local_workers=4)
    assert decide(busy).offload


def test_steps_of_microseconds_are_not_offloaded_without_a_worker_count():
    # 3 µs a sample at 200/s keeps 0.0006 of a worker busy: there is at least one
    steps = (StepCost("load", 1e-6, 0.1 * MB), StepCost("decode", 2e-6, 0.6 * MB))
    d = decide(OffloadInputs(gthp=1000.0, lthp=200.0, steps=steps, remote_workers=8,
                             bandwidth=1250 * MB))
    assert not d.offload and "0.00 of at least 1 busy" in d.reason


def test_steps_that_take_no_time_are_not_offloaded():
    for work in (0.0, -1e-3):  # nothing measured (or a clock going back): Pcycle 0
        steps = (StepCost("load", work, 0.1 * MB), StepCost("decode", work, 0.6 * MB))
        d = decide(OffloadInputs(gthp=1000.0, lthp=200.0, steps=steps, remote_workers=8,
                                 bandwidth=1250 * MB))
        assert not d.offload and "Pcycle = 0" in d.reason and d.predicted == 200.0


# -- the local side's capacity: the workers the loader may run, not only those Lthp ran --

def grown(**kw):
    """40 ms of steps a sample; 4 local workers ran them at Lthp 90/s (3.6 of 4 busy)."""
    steps = (StepCost("load", 0.001, 0.1 * MB), StepCost("decode", 0.019, 0.6 * MB),
             StepCost("augment", 0.020, 0.6 * MB))
    base = dict(gthp=150.0, lthp=90.0, steps=steps, remote_workers=8, bandwidth=1000 * MB,
                overhead_s=0.0005, local_workers=4)
    base.update(kw)
    return OffloadInputs(**base)


def test_no_offload_where_the_local_workers_the_loader_may_start_remove_the_stall():
    # the loader may run 8: 180/s > Gthp 150/s. Taking the 4 as all there was offloaded
    # every sample (ratio 1.00) where starting 4 more local workers did it
    d = decide(grown(local_max=8))
    assert not d.offload and "more local workers would remove the stall" in d.reason
    assert d.local == pytest.approx(180.0) and d.predicted == pytest.approx(150.0)
    for most in (None, 4, 2):  # none more may start (fewer: the 4 ran all the same)
        d = decide(grown(local_max=most))
        assert d.offload and d.local == pytest.approx(90.0) and d.ratio == 1.0


def test_the_estimate_counts_the_local_workers_the_loader_may_start():
    # Gthp 1000/s: offloading pays either way. Rthp 200/s (8 workers ÷ 40 ms); the 8 local
    # workers give 8 worker-seconds a second, less 200 × 0.5 ms for the offloaded samples,
    # over 40 ms: 177.5/s. Taking the 4 as all there was predicted 87.5/s there
    d = decide(grown(gthp=1000.0, local_max=8))
    assert d.offload and d.best.rthp == pytest.approx(200.0)
    assert d.predicted == pytest.approx(200.0 + 177.5)
    assert d.ratio == pytest.approx(200.0 / (180.0 + 200.0))  # line 13 against 180/s local
    assert d.lower == pytest.approx((1000.0 - 180.0) / (1 - 0.0005 / 0.040))
    assert "180.0/s with the local workers it may run" in d.describe()
    assert decide(grown(gthp=1000.0, local_max=4)).predicted == pytest.approx(200.0 + 87.5)


def test_offloading_must_beat_what_the_local_workers_may_reach():
    # a 10 MB/s link: 16.7 samples/s of 0.6 MB come back; with 8 local workers offloading
    # reaches 196.5/s against the 180/s they reach alone: under 1.1x (it is 2.2x Lthp)
    d = decide(grown(gthp=1000.0, bandwidth=10 * MB, local_max=8))
    assert not d.offload and "against 180.0/s local" in d.reason
    assert d.predicted == pytest.approx(180.0)
    assert decide(grown(gthp=1000.0, bandwidth=10 * MB, local_max=4)).offload


def test_the_local_bound_is_the_loaders_within_what_the_cores_keep_busy():
    assert local_bound(32, 8, 1.0) == 8  # CPU-bound samples: one worker a core
    assert local_bound(32, 8, None) == 8  # the share unknown: taken as CPU-bound
    assert local_bound(32, 8, 0.25) == 32  # samples waiting 3/4 of their time: 4 a core
    assert local_bound(32, 8, 0.1) == 32 and local_bound(6, 8, 0.5) == 6  # the loader's
    with pytest.raises(ValueError, match="local_max = 0"):
        grown(local_max=0)


# -- inputs FastFlow's rule cannot be decided from --

@pytest.mark.parametrize("kw, metric", [
    ({"lthp": 0.0}, "Lthp"),  # line 3's Gthp/Lthp: a ZeroDivisionError
    ({"lthp": math.nan}, "Lthp"),  # read as a stall: "offload: yes (Gthp/Lthp = nan)"
    ({"gthp": math.nan}, "Gthp"),  # read as "no accelerator bound known"
    ({"remote_thp": math.nan}, "remote_thp"),
    ({"bandwidth": math.nan}, "bandwidth"),
])
def test_a_nan_or_zero_throughput_is_named(kw, metric):
    with pytest.raises(ValueError, match=metric):
        decide(inputs(**kw))


def test_a_nan_step_time_is_named_not_read_as_zero():
    # max(0.0, nan) == 0.0: decode's 10 ms vanished, Pcycle read 11 ms instead of 21 ms
    steps = (StepCost("load", 0.001, 0.1 * MB), StepCost("decode", math.nan, 0.6 * MB),
             StepCost("augment", 0.010, 0.6 * MB))
    with pytest.raises(ValueError, match="'decode' has work_s = nan"):
        decide(inputs(steps=steps))


def test_this_hosts_wait_for_a_core_is_not_charged_to_remote_workers():
    # 4 local workers on 2 cores: augment's 20 ms wall is 10 ms of work and 10 ms waiting for
    # a core here (StepStats.queued_mean). 8 remote workers on their own cores run it in 10 ms:
    # 800 samples/s, not 400/s (which made the ratio 0.67 and the prediction 600/s)
    steps = (StepCost("load", 0.0, 0.1 * MB), StepCost("augment", 0.020, 0.15 * MB, 0.010))
    d = decide(OffloadInputs(gthp=1000.0, lthp=200.0, steps=steps, remote_workers=8,
                             bandwidth=1250 * MB))
    assert d.offload and (d.best.start, d.best.stop) == (0, 2)
    assert d.best.rthp == pytest.approx(800.0)
    assert d.ratio == pytest.approx(0.8) and d.predicted == pytest.approx(1000.0)
    assert d.pcycle == pytest.approx(0.020)  # a local worker is held for the wait all the same


def test_the_profiles_wait_for_a_core_reaches_the_decision():
    from headrace.planner.offload import inputs_from_profile
    from headrace.profiler.report import PipelineProfile, StepStats

    aug = StepStats("augment", 100, 0.020, 0.020, 0.020, 0.010, 0.0, 0.15 * MB, None, None,
                    None, None, None, queued_mean=0.010)
    x = inputs_from_profile(PipelineProfile((aug,), 100, 0.02, 0.02, ()), gthp=1000.0,
                            lthp=200.0, remote_workers=8)
    assert x.steps[0].work_s == 0.020 and x.steps[0].remote_s == pytest.approx(0.010)
    assert decide(x).best.rthp == pytest.approx(800.0)
