"""The bench's headrace notes split the consumer's time inside next() (bench/summary.py)."""

import pytest

from headrace.bench.config import LoaderSpec
from headrace.bench.measure import HeadraceTrace, RunRecord
from headrace.bench.resources import ResourceUse
from headrace.bench.summary import summarize


def _run(outer_stall_s: float, own_stall_s: float) -> RunRecord:
    spec = LoaderSpec(label="headrace", kind="headrace", num_workers=2)
    trace = HeadraceTrace(fast_samples=4, slow_samples=0, timeout_s=0.005,
                          timeout_percentile=75.0, main_cpu_per_batch_ms=1.0,
                          stall_s=own_stall_s, workers=[(0.0, 2)], timeout=[], queues=[])
    return RunRecord(label="headrace", spec=spec, wall_s=1.0, ideal_s=0.9, bound_s=0.8,
                     ideal_stall_fraction=0.01, stall_s=outer_stall_s, samples=4, batches=2,
                     resources=ResourceUse(1, 1.0, 0.5, 2.0, 10), batch_times=[],
                     costs=[0.1] * 4, consumer_step_s=0.1, headrace=trace)


def test_next_is_split_into_waiting_for_batches_and_the_rest():
    row = summarize(LoaderSpec(label="headrace", kind="headrace", num_workers=2),
                    [_run(0.100, 0.040), _run(0.120, 0.050), _run(0.080, 0.030)])
    x = row.extras()
    assert x["next_waiting_ms"] == pytest.approx(40.0)  # medians over the runs
    assert x["next_other_ms"] == pytest.approx(60.0)


def test_a_loader_wait_above_the_harness_stall_reads_as_no_other_time():
    # the two clocks are read a few instructions apart: never a negative remainder
    x = summarize(LoaderSpec(label="headrace", kind="headrace", num_workers=2),
                  [_run(0.0400, 0.0401)]).extras()
    assert x["next_other_ms"] == 0.0
