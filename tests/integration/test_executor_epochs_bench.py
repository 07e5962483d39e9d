"""python -m headrace.bench.executor_epochs: both executors run every epoch exactly once and the
report names auto's decision."""

import pytest

from headrace.bench import executor_epochs

pytestmark = pytest.mark.integration


def test_executor_epochs_bench_runs_both_executors_over_their_epochs():
    res = executor_epochs.run(["imseg"], rounds=1, n=2, workers=1, num_samples=24)
    walls, decisions = res["imseg"]["auto"]
    assert len(walls) == 1 and len(walls[0]) == 2 and min(walls[0]) > 0
    assert len(res["imseg"]["processes"][0][0]) == 2
    text = executor_epochs.markdown(res)
    assert "| processes |" in text and "| auto |" in text and "epoch 2" in text
