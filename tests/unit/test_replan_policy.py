"""When FastFlow's offloading is decided again (planner/replan.py), on synthetic traces."""

import math

import pytest

from headrace.planner.offload import OffloadInputs, StepCost, decide
from headrace.planner.replan import (
    EpochObservation,
    ReplanConfig,
    Watch,
    check_cluster,
    check_epoch,
    local_capacity,
    pcycle,
    revise,
)


def steps(work_s=0.020):
    return (StepCost("load", work_s / 2, 4096.0), StepCost("augment", work_s / 2, 4096.0))


def inputs(**kw):
    base = dict(gthp=400.0, lthp=50.0, steps=steps(), remote_workers=4, bandwidth=math.inf)
    base.update(kw)
    return OffloadInputs(**base)


def watch(**kw):
    x = inputs(**kw)
    return Watch(x, decide(x))


def epoch(rate, remote=0, work_s=0.020, samples=1000):
    return EpochObservation(samples=samples, wall_s=samples / rate, remote_samples=remote,
                            steps=steps(work_s))


def test_cluster_change_is_named_both_ways():
    w = watch()
    assert check_cluster(w, 4) is None
    assert "joined" in check_cluster(w, 6) and "4 -> 6" in check_cluster(w, 6)
    assert "left" in check_cluster(w, 1)


def test_a_node_joining_turns_no_offload_into_offload():
    w = watch(remote_workers=0)
    assert not w.decision.offload and "no remote worker" in w.decision.reason
    reason = check_cluster(w, 4)
    assert reason is not None
    d = decide(revise(w.inputs, remote_workers=4))
    assert d.offload and d.ratio > 0 and d.predicted > w.decision.predicted


def test_throughput_as_predicted_never_triggers():
    cfg, w = ReplanConfig(), watch()
    predicted = w.decision.predicted
    for rate in (predicted, 0.9 * predicted, 1.1 * predicted, 0.8 * predicted) * 5:
        w, why = check_epoch(cfg, w, epoch(rate))
        assert why is None


def test_drift_must_last_patience_epochs():
    cfg, w = ReplanConfig(drift=0.25, patience=2), watch()
    low = 0.5 * w.decision.predicted
    w, why = check_epoch(cfg, w, epoch(low))
    assert why is None and w.drifting == 1
    w, why = check_epoch(cfg, w, epoch(w.decision.predicted))  # back on track: count resets
    assert why is None and w.drifting == 0
    w, why = check_epoch(cfg, w, epoch(low))
    w, why = check_epoch(cfg, w, epoch(low))
    assert why is not None and "throughput drifted" in why and "2 epoch" in why
    assert w.drifting == 0


def test_profile_change_triggers_at_once_and_revise_follows_it():
    cfg, w = ReplanConfig(), watch(remote_workers=2, remote_thp=100.0)
    w2, why = check_epoch(cfg, w, epoch(w.decision.predicted, work_s=0.040))
    assert why is not None and "profile changed" in why and "20.0 -> 40.0 ms" in why
    x = revise(w.inputs, steps=steps(0.040))
    assert pcycle(x.steps) == pytest.approx(0.040)
    assert x.lthp == pytest.approx(25.0)  # the same local CPU-seconds, twice the work
    assert x.remote_thp == pytest.approx(50.0)  # a remote worker keeps its measured speed
    assert x.remote_workers == 2 and x.gthp == w.inputs.gthp


def test_revise_scales_remote_throughput_with_workers():
    x = revise(inputs(remote_workers=2, remote_thp=80.0), remote_workers=6)
    assert x.remote_thp == pytest.approx(240.0)
    assert revise(inputs(remote_thp=None), remote_workers=6).remote_thp is None


def test_local_capacity_from_an_epoch():
    w = watch(remote_workers=0)  # no offload: every sample local
    assert local_capacity(w, epoch(40.0)) == pytest.approx(40.0)
    w = watch()
    assert w.decision.offload and w.decision.best is not None
    # 1000 samples in 5 s, 600 of them remote: each remote one still cost ocycle here
    ocycle, p = w.decision.best.ocycle, 0.020
    got = local_capacity(w, epoch(200.0, remote=600))
    assert got == pytest.approx((400 * p + 600 * ocycle) / 5.0 / p)
    # accelerator-bound epoch (at Gthp): the local workers idled, their capacity is unknown
    assert local_capacity(w, epoch(400.0)) is None


def test_a_trace_with_a_heavier_phase_asks_for_more_remote_workers():
    """Epochs 1-4 as planned, then the pipeline's work doubles: one re-decision, at epoch 5,
    that needs twice the remote workers for the same throughput."""
    cfg = ReplanConfig()
    w = watch(gthp=100.0, lthp=50.0, remote_workers=8, remote_thp=400.0)

    def needed(w: Watch) -> int:
        x = w.inputs
        return w.decision.workers_needed(x.remote_thp / x.remote_workers, x.remote_workers)

    first = needed(w)
    reasons = []
    for e in range(8):
        work = 0.020 if e < 4 else 0.040
        w, why = check_epoch(cfg, w, epoch(w.decision.predicted, work_s=work))
        if why is not None:
            x = revise(w.inputs, steps=steps(work))
            w = Watch(x, decide(x))
            reasons.append(e)
    assert reasons == [4]
    assert w.decision.offload and w.decision.predicted == pytest.approx(100.0)
    assert (first, needed(w)) == (2, 4)


def test_config_is_validated():
    with pytest.raises(ValueError):
        ReplanConfig(patience=0)
    with pytest.raises(ValueError):
        ReplanConfig(drift=0)


def test_an_epoch_spent_wholly_remote_says_nothing_of_the_local_capacity():
    # every sample finished remotely at no local cost (Ocycle 0): 0 local CPU-seconds, which
    # as Lthp = 0 made the re-decision divide by it
    x = inputs(overhead_s=0.0, remote_workers=16)
    w = Watch(x, decide(x))
    assert w.decision.offload and w.decision.best.ocycle == 0.0
    assert local_capacity(w, epoch(100.0, remote=1000)) is None


def test_a_profile_with_a_nan_time_keeps_the_decision_in_force():
    # the watcher read a NaN step time as 0 ms ("profile changed: 20.0 -> 10.0 ms") and
    # decided again from it; now the profile is set aside and the epoch judged by throughput
    from types import SimpleNamespace

    import headrace as hr
    from headrace.profiler.report import PipelineProfile, StepStats
    from headrace.remote.replan import OffloadWatcher
    from headrace.remote.session import RemoteSession

    def st(name, wall):
        return StepStats(name, 100, wall, wall, wall, wall, 0.0, 4096.0, None, None, None,
                         None, None)

    profile = PipelineProfile((st("load", 0.010), st("augment", math.nan)), 100, 0.02, 0.02, ())
    x = inputs()
    d = decide(x)
    epochs: list = []
    watcher = OffloadWatcher(RemoteSession(hr.Remote(max_workers=4)), x, d, lambda: profile,
                             lambda: epochs)
    epochs.append(SimpleNamespace(samples=1000, wall_s=1000 / d.predicted))  # as predicted
    watcher.on_tick(SimpleNamespace(pool=None))
    assert watcher.history == [] and watcher.watch.inputs is x


def test_an_offloading_epochs_idle_local_workers_do_not_turn_offloading_off():
    """The Lthp an offloading epoch measures is the local CPU it used: its local workers waited
    on slower remote ones. The refusal for idle local workers (meant for the probe's Lthp)
    read that as a stall elsewhere and turned offloading off; the local-only epoch that
    followed drifted from its prediction and turned it on again: offloading every other
    epoch, at 100 samples/s where it gave 160 (a review's find)."""
    steps = (StepCost("load", 0.002, 100e3), StepCost("decode", 0.030, 600e3),
             StepCost("aug", 0.008, 600e3))
    x = OffloadInputs(gthp=1000.0, lthp=100.0, steps=steps, remote_workers=8, bandwidth=1e9,
                      overhead_s=0.001, local_workers=4)
    cfg, w = ReplanConfig(), Watch(x, decide(x))
    assert w.decision.offload
    offloading = []
    for _ in range(8):  # offloading: remote workers at a third of the modelled speed, 160/s
        if w.decision.offload:
            obs = EpochObservation(samples=16000, wall_s=100.0, remote_samples=13000,
                                   steps=steps)
        else:  # local workers alone: 100/s
            obs = EpochObservation(samples=10000, wall_s=100.0, remote_samples=0, steps=steps)
        w, why = check_epoch(cfg, w, obs)
        if why is not None:
            lthp = local_capacity(w, obs) if "throughput" in why else None
            nx = revise(w.inputs, steps=steps, lthp=lthp, offloaded=obs.remote_samples > 0)
            w = Watch(nx, decide(nx))
        offloading.append(w.decision.offload)
    assert all(offloading), offloading


def test_an_lthp_measured_after_the_scaler_grew_the_workers_is_not_extrapolated_again():
    # the probe ran 4 local workers of the 8 the loader may run: 180/s locally. An epoch
    # then measured Lthp 180/s with 8: extrapolated from the probe's 4 it read 360/s
    from headrace.planner.offload import local_thp
    from headrace.remote.replan import remeasured

    x = inputs(lthp=90.0, local_workers=4, local_max=8)
    assert local_thp(x) == pytest.approx(180.0)
    after = remeasured(x, None, 180.0, False, 8)
    assert after.local_workers == 8 and local_thp(after) == pytest.approx(180.0)
    assert remeasured(x, None, None, False, 8).local_workers == 4  # Lthp not measured again
    assert remeasured(x, None, 180.0, False, None).local_workers == 4  # a fixed count
