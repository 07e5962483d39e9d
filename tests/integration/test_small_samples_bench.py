"""python -m headrace.bench.small_samples: every row runs, delivers every sample, and the
rows that change the queueing or hand-off policy leave it as they found it."""

import pytest

from headrace.bench import small_samples
from headrace.pipeline import runner
from headrace.planner import queueing, timeout

pytestmark = pytest.mark.integration


def test_small_samples_bench_runs_every_row_and_reports_ratios():
    names = ("MAX_DEPTH", "CHEAP_QUEUE_S", "CHEAP_HOLD_S")
    before = [getattr(queueing, k) for k in names] + [timeout.HANDOFF_MIN_S, runner.PYTHON_MARKS]
    res = small_samples.run(rounds=1, samples=400, workers=1, batch=32)
    assert before == [getattr(queueing, k) for k in names] + [timeout.HANDOFF_MIN_S,
                                                              runner.PYTHON_MARKS]
    assert set(res) == {"cifar", "cifar-dataset", "tiny"}
    for rows in res.values():
        assert set(rows) == {"headrace", "headrace, no cache", "headrace, Python seeded every step",
                             "headrace, short moves", "headrace, 1 ms messages",
                             "headrace, a message per sample", "torch, 1 workers",
                             "torch, 2 workers"}
        assert all(len(v) == 1 and v[0][0] > 0 and v[0][3] > 0 for v in rows.values())
        for label, v in rows.items():  # moves are counted for headrace's rows only
            assert (v[0][2] is None) == label.startswith("torch"), label
    text = small_samples.markdown(res, 400, 1)
    assert text.count("| headrace |") == 3 and "vs torch's best" in text
    assert "moved to the slow lane" in text and "workers' CPU µs/sample" in text


def test_the_cifar_steps_match_torchs_dataset_on_a_sample():
    pipe = small_samples.pipelines(4)["cifar"]
    x = small_samples._TorchDataset(pipe)[2]
    assert x.shape == (3, 32, 32) and x.dtype.is_floating_point


def test_runner_costs_price_each_part_and_restore_the_runner():
    from headrace.pipeline import runner, seeding

    costs = small_samples.runner_costs(samples=50, repeats=1)
    assert list(costs) == ["the steps alone", "headrace's runner",
                           "without re-seeding the global generators",
                           "... and without a generator per random step",
                           "... and without the sample's root seed"]
    assert all(us > 0 for us in costs.values())
    assert (runner.seed_globals, runner.seed_numpy_torch, runner.step_rng,
            runner.sample_root) == (seeding.seed_globals, seeding.seed_numpy_torch,
                                    seeding.step_rng, seeding.sample_root)


def test_the_dataset_workload_is_one_object_for_both_loaders():
    ds, torch_ds = small_samples.workloads(4)["cifar-dataset"]
    x, y = ds[2]
    assert torch_ds is ds and x.shape == (3, 32, 32) and y == 2


def test_the_executors_mode_runs_each_executor_over_its_epochs():
    res = small_samples.executors(samples=256, workers=1, epochs=2, batch=32)
    assert list(res) == ["processes", "auto", "threads"]
    assert all(len(rates) == 2 and min(rates) > 0 for rates, _ in res.values())
