"""``print(loader.stats())`` (README's "Use" block) is a few readable lines; ``repr()`` keeps
every field."""

from __future__ import annotations

import dataclasses

from headrace.telemetry.stats import CacheStats, EpochStats, LoaderStats, QueueSample


def _stats(epochs: int) -> LoaderStats:
    cache = CacheStats(lookups=64, hits=48, hits_by_tier={"decoded": 48}, inserts=16,
                       uncacheable=0, full=0, errors=0)
    eps = tuple(EpochStats(epoch=k, wall_s=0.5, stall_s=0.125, batches=4, samples=64,
                           samples_per_s=128.0, fast_samples=62, slow_samples=2,
                           skipped_samples=0, retried_samples=0, main_cpu_per_batch_ms=3.0,
                           finished=k < epochs - 1, cache=cache if k else None)
                for k in range(epochs))
    return LoaderStats(epochs=eps, timeout_s=0.0123, timeout_percentile=75.0, workers=2,
                       workers_timeline=((0.0, 2),), timeout_timeline=((0.0, 0.0123),),
                       queues=tuple(QueueSample(0.1 * k, 1, 2, 3, 0) for k in range(130)),
                       worker_restarts=0)


def test_str_is_a_few_lines_with_the_numbers():
    s = _stats(90)
    text = str(s)  # it was the 46 KB repr: every epoch and 130 queue samples
    lines = text.splitlines()
    assert len(lines) == 6 and len(text) < 1200, text
    assert lines[0] == ("LoaderStats: 90 epoch(s) recorded, 2 worker(s) now (0 between epochs "
                        "unless they persist), 0 worker restart(s), "
                        "hand-off timeout 12.3 ms (75th percentile)")
    assert lines[1] == ("  epoch 0: 64 samples in 4 batches, 0.50 s, 128.0 samples/s, "
                        "stall 25%, 62 fast / 2 slow")
    assert lines[2] == "  ... 86 epoch(s) not shown"
    assert lines[5] == ("  epoch 89 (unfinished: running, or stopped part-way): 64 samples in "
                        "4 batches, 0.50 s, 128.0 samples/s, "
                        "stall 25%, 62 fast / 2 slow, cache hits 48 of 64 (75%)")
    assert repr(s).startswith("LoaderStats(epochs=(EpochStats(epoch=0,")  # unchanged
    assert "QueueSample(" in repr(s)


def test_str_of_few_epochs_a_fixed_and_a_warming_timeout():
    assert str(_stats(0)).count("\n") == 0
    two = str(_stats(2))
    assert "epoch 0:" in two and "epoch 1 (unfinished: running, or stopped part-way):" in two and "not shown" not in two
    fixed = dataclasses.replace(_stats(1), timeout_percentile=float("nan"))
    assert "hand-off timeout 12.3 ms (fixed)" in str(fixed)
    warming = dataclasses.replace(_stats(1), timeout_s=float("inf"))
    assert "hand-off timeout none yet" in str(warming)
