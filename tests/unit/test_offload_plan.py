"""The local worker counts ``plan_offload`` gives FastFlow's decision (remote/offload_plan.py):
with ``num_workers="auto"``, what the worker scaler has grown the pool to and may grow it to,
not the count the pool started with. Numbers and an unstarted loader: no process."""

import torch

import headrace as hr
from headrace.planner.offload import OffloadInputs, StepCost, decide
from headrace.planner.workers import ScaleDecision
from headrace.profiler.report import PipelineProfile, StepStats
from headrace.remote.offload_plan import loader_local_workers, local_counts


def test_a_fixed_count_is_what_ran_and_all_there_is():
    assert local_counts(started=4, reached=None, bound=None, cores=8, share=1.0) == (4, 4)


def test_auto_counts_what_the_scaler_reached_and_may_reach():
    # started 2, grown to 6 during the probe; the scaler's bound 16 (2 × 8 cores)
    assert local_counts(2, 6, 16, 8, 1.0) == (6, 8)  # CPU-bound: 8 cores keep 8 busy
    assert local_counts(2, 6, 16, 8, 0.25) == (6, 16)  # samples that mostly wait: the bound
    assert local_counts(2, 12, 16, 8, 1.0) == (12, 12)  # past the cores already: none more


def test_the_loaders_scaler_count_reaches_the_decision():
    # a sample: 40 ms of wall, 4 ms of it CPU (share 0.1: the cores do not bound 8 workers)
    aug = StepStats("aug", 100, 0.040, 0.040, 0.040, 0.004, 0.0, 4096.0, None, None, None,
                    None, None)
    profile = PipelineProfile((aug,), 100, 0.040, 0.040, ())
    loader = hr.DataLoader([torch.zeros(2)] * 64, batch_size=4, num_workers="auto",
                           options=hr.Options(autoscale=hr.AutoscaleConfig(initial=2,
                                                                           max_workers=8),
                                              remote=hr.Remote(max_workers=4)))
    assert int(loader.num_workers) == 2
    loader.monitor.record_workers(3)  # what the scaler records at each of its decisions
    assert loader_local_workers(loader, profile) == (3, 8)
    fixed = hr.DataLoader([torch.zeros(2)] * 64, batch_size=4, num_workers=2,
                          options=hr.Options(remote=hr.Remote(max_workers=4)))
    assert loader_local_workers(fixed, profile) == (2, 2)


def test_the_start_count_misread_how_busy_the_local_workers_were():
    # the pool started 2 and the scaler grew it to 8; at Lthp 50/s the 40 ms steps keep 2 of
    # them busy: the stall is elsewhere. Read as 2 of 2 busy, the job was offloaded
    steps = (StepCost("load", 0.001, 0.1e6), StepCost("aug", 0.039, 0.6e6))
    base = dict(gthp=200.0, lthp=50.0, steps=steps, remote_workers=8, bandwidth=1e9)
    ran, most = local_counts(2, 8, 16, 8, 1.0)
    d = decide(OffloadInputs(**base, local_workers=ran, local_max=most))
    assert not d.offload and "keep 2.00 of 8 busy" in d.reason
    assert decide(OffloadInputs(**base, local_workers=2)).offload


def test_the_most_local_workers_stay_within_the_memory_budget():
    # samples that mostly wait: the scaler's bound (16) would be the most, but its memory budget
    # allows 5 workers: the estimate counted on 16 local workers and offloaded too little
    assert local_counts(2, 4, 16, 8, 0.25, memory_cap=5) == (4, 5)
    assert local_counts(2, 6, 16, 8, 0.25, memory_cap=5) == (6, 6)  # ran more already
    assert local_counts(2, 4, 16, 8, 0.25, memory_cap=None) == (4, 16)


def test_the_loaders_memory_cap_reaches_the_estimate():
    aug = StepStats("aug", 100, 0.040, 0.040, 0.040, 0.004, 0.0, 4096.0, None, None, None,
                    None, None)
    profile = PipelineProfile((aug,), 100, 0.040, 0.040, ())
    loader = hr.DataLoader([torch.zeros(2)] * 64, batch_size=4, num_workers="auto",
                           options=hr.Options(autoscale=hr.AutoscaleConfig(
                               initial=2, max_workers=8), remote=hr.Remote(max_workers=4)))
    loader.monitor.record_workers(3)
    assert loader_local_workers(loader, profile) == (3, 8)  # no worker measured yet
    # a decision that measured the workers' memory (the scaler's own record of its cap)
    loader.monitor.scaler.decisions.append(ScaleDecision(3, 3, 0.0, 0.5, 0.9, memory_cap=4))
    assert loader.monitor.memory_cap() == 4
    assert loader_local_workers(loader, profile) == (3, 4)
