"""``headrace demo``'s one-sentence reason (``bench/demo._reason``), from real run records: it
must match how many epochs ran."""

from __future__ import annotations

from headrace.bench.config import LoaderSpec
from headrace.bench.measure import HeadraceTrace, RunRecord
from headrace.bench.resources import ResourceUse
from headrace.telemetry.stats import CacheStats


def _epoch(wall_s: float, cache: CacheStats | None) -> RunRecord:
    spec = LoaderSpec(label="headrace", kind="headrace", num_workers=2)
    trace = HeadraceTrace(fast_samples=8, slow_samples=0, timeout_s=0.005,
                          timeout_percentile=75.0, main_cpu_per_batch_ms=1.0, stall_s=0.1,
                          workers=[(0.0, 2)], timeout=[], queues=[], cache=cache)
    return RunRecord(label="headrace", spec=spec, wall_s=wall_s, ideal_s=0.9, bound_s=0.8,
                     ideal_stall_fraction=0.01, stall_s=0.1, samples=8, batches=2,
                     resources=ResourceUse(1, 1.0, 0.5, 2.0, 10), batch_times=[],
                     costs=[0.1] * 8, consumer_step_s=0.1, headrace=trace)


def test_demo_reason_after_one_epoch_and_after_two():
    from headrace.bench.demo import _reason

    filled = CacheStats(lookups=8, hits=0, hits_by_tier={}, inserts=8, uncacheable=0, full=0,
                        errors=0, bytes_by_tier={"decoded": 1 << 20})
    read = CacheStats(lookups=8, hits=8, hits_by_tier={"decoded": 8}, inserts=0,
                      uncacheable=0, full=0, errors=0)
    torch_runs = [_epoch(2.0, None), _epoch(1.5, None)]
    one = _reason(torch_runs[:1], [_epoch(2.1, filled)])
    # it said "headrace's cache was off or empty (Options(cache=None)?)" right after the
    # sentence saying it stored 8 samples
    assert "stored 8 samples" in one and "Options(cache=None)" not in one
    assert "only one epoch ran, so headrace never read its cache back" in one
    two = _reason(torch_runs, [_epoch(2.1, filled), _epoch(0.5, read)])
    assert "in epoch 2 headrace served 100% of samples" in two  # it read "epochs 2-2"
    assert "epoch 2 took 0.50 s vs torch's 1.50 s." in two
    three = _reason([*torch_runs, _epoch(1.4, None)],
                    [_epoch(2.1, filled), _epoch(0.5, read), _epoch(0.7, read)])
    assert "in epochs 2-3 headrace served" in three and "(medians)" in three
