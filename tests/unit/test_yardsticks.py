"""The yardsticks on small schedules computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headrace.bench.yardsticks import (
    ideal_pipeline_time,
    num_batches,
    simulate_ideal,
    work_conserving_bound,
)


def test_one_worker_runs_samples_back_to_back():
    # samples 1 s, 2 s, 3 s, 4 s; batches {0,1} ready at 3, {2,3} ready at 10; consumer 1 s each
    r = simulate_ideal(
        [0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0], batch_size=2, workers=1, consumer_step_s=1.0
    )
    assert r.batch_ready_s == (3.0, 10.0)
    assert r.batch_start_s == (3.0, 10.0)
    assert r.end_s == 11.0
    assert r.consumer_stall_s == 3.0 + 6.0  # waited 0→3, then 4→10
    assert r.worker_busy_s == 10.0
    assert r.workers_end_s == 10.0


def test_two_workers_one_heavy_sample_holds_only_its_batch():
    # order 0..5, sample 0 costs 10 s, the rest 1 s; batch size 2, two workers.
    # worker A: s0 [0,10]; worker B: s1 [0,1] s2 [1,2] s3 [2,3] s4 [3,4] s5 [4,5]
    cost = {0: 10.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}
    r = simulate_ideal(range(6), cost, batch_size=2, workers=2, consumer_step_s=0.5)
    assert r.batch_ready_s == (10.0, 3.0, 5.0)
    # batches are consumed in order: the first at 10, then the others, already ready
    assert r.batch_start_s == (10.0, 10.5, 11.0)
    assert r.end_s == 11.5
    assert r.consumer_stall_s == 10.0


def test_sampler_order_decides_who_starts_first():
    cost = [10.0, 1.0, 1.0, 1.0]
    heavy_first = ideal_pipeline_time([0, 1, 2, 3], cost, 2, 2, 0.0)
    heavy_last = ideal_pipeline_time([1, 2, 3, 0], cost, 2, 2, 0.0)
    assert heavy_first == 10.0  # s0 on A [0,10]; B does the three others by 3
    assert heavy_last == 11.0  # s1 A [0,1], s2 B [0,1], s3 A [1,2], s0 B [1,11]


def test_consumer_bound():
    # workers finish everything by 1 s; the consumer needs 5 × 2 s
    r = simulate_ideal(range(10), [0.1] * 10, batch_size=2, workers=10, consumer_step_s=2.0)
    assert r.batch_ready_s == (0.1,) * 5
    assert r.end_s == pytest.approx(0.1 + 5 * 2.0)
    assert r.consumer_stall_s == pytest.approx(0.1)  # only the fill


def test_drop_last_never_processes_the_tail():
    cost = [1.0, 1.0, 1.0, 1.0, 100.0]
    kept = simulate_ideal(
        range(5), cost, batch_size=2, workers=1, consumer_step_s=0.0, drop_last=True
    )
    assert kept.n_batches == 2
    assert kept.end_s == 4.0
    assert kept.worker_busy_s == 4.0
    full = simulate_ideal(range(5), cost, batch_size=2, workers=1, consumer_step_s=0.0)
    assert full.n_batches == 3
    assert full.batch_ready_s[-1] == 104.0


def test_partial_last_batch_is_ready_with_its_own_samples():
    r = simulate_ideal(range(3), [1.0, 1.0, 1.0], batch_size=2, workers=1, consumer_step_s=0.5)
    assert r.batch_ready_s == (2.0, 3.0)
    assert r.end_s == 3.5


def test_empty_epoch_takes_no_time():
    r = simulate_ideal([], [], batch_size=4, workers=2, consumer_step_s=1.0)
    assert r.end_s == 0.0 and r.n_batches == 0 and r.stall_fraction == 0.0
    assert work_conserving_bound([], 2, 1.0, 0) == 0.0


def test_work_conserving_bound_takes_the_larger_term():
    assert (
        work_conserving_bound([1.0, 2.0, 3.0], workers=2, consumer_step_s=0.1, n_batches=3) == 3.0
    )
    assert (
        work_conserving_bound([1.0, 2.0, 3.0], workers=2, consumer_step_s=2.0, n_batches=3) == 6.0
    )


def test_num_batches_counts_like_torch():
    assert num_batches(10, 3) == 4
    assert num_batches(10, 3, drop_last=True) == 3
    assert num_batches(0, 3) == 0


@pytest.mark.parametrize("seed", range(20))
def test_ideal_is_never_below_the_bound(seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    cost = rng.lognormal(0.0, 1.0, n)
    order = rng.permutation(n)
    batch = int(rng.integers(1, 33))
    workers = int(rng.integers(1, 17))
    step = float(rng.uniform(0.0, 3.0))
    drop_last = bool(rng.integers(0, 2))
    r = simulate_ideal(order, cost, batch, workers, step, drop_last)
    kept = [cost[i] for i in order[: r.n_batches * batch]]
    bound = work_conserving_bound(kept, workers, step, r.n_batches)
    assert r.end_s >= bound - 1e-9
    assert r.n_batches == num_batches(n, batch, drop_last)
    assert math.isclose(r.worker_busy_s, sum(kept))
    assert 0.0 <= r.stall_fraction <= 1.0 and 0.0 <= r.worker_utilization <= 1.0 + 1e-12
    assert list(r.batch_start_s) == sorted(r.batch_start_s)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0},
        {"workers": 0},
        {"consumer_step_s": -1.0},
        {"cost": [1.0, -1.0]},
    ],
)
def test_invalid_arguments_are_rejected(kwargs):
    args = {
        "order": [0, 1],
        "cost": [1.0, 1.0],
        "batch_size": 1,
        "workers": 1,
        "consumer_step_s": 0.0,
    }
    args.update(kwargs)
    with pytest.raises(ValueError):
        simulate_ideal(**args)
