"""The epoch lines of ``explain()`` (planner/explain.py) and the cache's (cache/session.py),
from plain numbers: every count ``stats()`` has that is not zero, and an epoch left part-way
is not called running."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp

import pytest

import headrace as hr
from headrace.cache.session import CacheSession
from headrace.cache.tiers import Tier, TierLayout
from headrace.planner.explain import Facts, explain_text
from headrace.telemetry.stats import CacheStats, EpochStats, LoaderStats

EPOCH = EpochStats(epoch=0, wall_s=2.0, stall_s=0.5, batches=10, samples=100,
                   samples_per_s=50.0, fast_samples=100, slow_samples=0, skipped_samples=0,
                   retried_samples=0, main_cpu_per_batch_ms=1.0, finished=True)


def explain(*epochs: EpochStats, running: bool = False) -> list[str]:
    stats = LoaderStats(epochs=epochs, timeout_s=float("inf"), timeout_percentile=75,
                        workers=2, workers_timeline=(), timeout_timeline=(), queues=(),
                        worker_restarts=0)
    f = Facts(fingerprint="f", samples=100, batch_size=10, workers=2, batching="b",
              declared=("a",), executed=("a",), order=None, next_order=None, handoff=True,
              stats=stats, timeout_samples=0, scale_decisions=(), profile=None,
              profile_note="n", **({"running": True} if running else {}))
    return [line for line in explain_text(f).splitlines() if line.startswith("epoch ")]


def test_an_epoch_left_part_way_is_not_running() -> None:
    left = dataclasses.replace(EPOCH, batches=5, samples=50, finished=False)
    now = dataclasses.replace(EPOCH, epoch=1, batches=3, samples=30, finished=False)
    lines = explain(left, now, running=True)
    assert lines[0].endswith("(left part-way, after 5 batches)")
    assert lines[1].endswith("(running)")
    (only,) = explain(left)  # its iterator dropped, no later epoch yet
    assert only.endswith("(left part-way, after 5 batches)")
    (done,) = explain(EPOCH, running=False)
    assert "running" not in done and "part-way" not in done


@pytest.mark.parametrize("field,words", [
    ("failed_samples", "failed 5 (raised in the loop)"),
    ("moved_samples", "moved 5 (to an idle worker)"),
    ("retried_samples", "retried 5 (their worker died)"),
])
def test_counts_stats_has_are_said_where_not_zero(field: str, words: str) -> None:
    (line,) = explain(dataclasses.replace(EPOCH, **{field: 5}))
    assert words in line
    (line,) = explain(EPOCH)
    assert words.split()[0] not in line


def test_the_cache_line_says_lookups_not_made() -> None:
    s = CacheSession(hr.Cache(budget_bytes=1 << 20), mp.get_context("fork"), 1, 1 << 20)
    s.layout = TierLayout((Tier("decoded", 1, False, False, "p" * 16),), 2)
    numbers = dict(lookups=200, hits=187, hits_by_tier={"decoded": 187}, inserts=0,
                   uncacheable=0, full=0, errors=0)
    for n, not_worth in enumerate((13, 0)):
        s.closed_epochs.append(CacheStats(**numbers, not_worth=not_worth))
        s.epoch_numbers.append(n)
    lines = [line for line in s.explain_lines(False) if line.startswith("  epoch ")]
    assert "187 hits of 200 lookups" in lines[0] and "13 not looked up" in lines[0]
    assert "not looked up" not in lines[1]


def test_adapted_counts_only_decisions_that_changed_the_count() -> None:
    from headrace.planner.workers import ScaleDecision

    kept = ScaleDecision(current=2, new=2, delta=0.1, queue_fill=0.5, cpu_usage=0.5,
                         memory_cap=None)
    added = dataclasses.replace(kept, new=4)
    stats = LoaderStats(epochs=(), timeout_s=float("inf"), timeout_percentile=75, workers=4,
                        workers_timeline=(), timeout_timeline=(), queues=(), worker_restarts=0)
    f = Facts(fingerprint="f", samples=100, batch_size=10, workers="auto", batching="b",
              declared=("a",), executed=("a",), order=None, next_order=None, handoff=True,
              stats=stats, timeout_samples=0, scale_decisions=(added, kept, kept),
              profile=None, profile_note="n")
    assert "workers: adapted 1 time in 3 decisions (Formulas 1-2); last: kept 2 workers" \
        in explain_text(f)


@pytest.mark.parametrize("samples,stored,words", [
    (300, 0, "over the last 300 samples (fallback"),
    (0, 101, "over 101 quantiles of the stored profile (fallback"),
    (40, 101, "over the last 40 samples and 101 quantiles of the stored profile (fallback"),
])
def test_the_slow_lane_line_says_what_its_timeout_was_taken_over(samples, stored, words):
    stats = LoaderStats(epochs=(EPOCH,), timeout_s=0.02, timeout_percentile=90,
                        workers=2, workers_timeline=(), timeout_timeline=(), queues=(),
                        worker_restarts=0, timeout_fallback_from=75)
    f = Facts(fingerprint="f", samples=100, batch_size=10, workers=2, batching="b",
              declared=("a", "b"), executed=("a", "b"), order=None, next_order=None,
              handoff=True, stats=stats, timeout_samples=samples, timeout_stored=stored,
              scale_decisions=(), profile=None, profile_note="n")
    (line,) = [x for x in explain_text(f).splitlines() if x.startswith("slow lane:")]
    assert words in line


def slow_lane_line(percentile: float, fallback_from: float | None = None) -> str:
    stats = LoaderStats(epochs=(EPOCH,), timeout_s=0.005, timeout_percentile=percentile,
                        workers=2, workers_timeline=(), timeout_timeline=(), queues=(),
                        worker_restarts=0, timeout_fallback_from=fallback_from)
    f = Facts(fingerprint="f", samples=100, batch_size=10, workers=2, batching="b",
              declared=("a", "b"), executed=("a", "b"), order=None, next_order=None,
              handoff=True, stats=stats, timeout_samples=96, scale_decisions=(), profile=None,
              profile_note="n")
    (line,) = [x for x in explain_text(f).splitlines() if x.startswith("slow lane:")]
    return line


def test_a_fixed_timeout_is_called_fixed_not_a_percentile() -> None:
    line = slow_lane_line(float("nan"))  # what stats() reports for TimeoutConfig(fixed_s=)
    assert line.startswith("slow lane: hand-off timeout 5.0 ms, fixed by "
                           "TimeoutConfig(fixed_s=0.005), not learned;")
    assert "per-sample time" not in line and "samples went slow at" not in line


def test_the_fallback_is_said_only_when_it_holds_and_names_the_percentile_it_replaced() -> None:
    line = slow_lane_line(80.0)  # a configured p80, no fallback
    assert "= p80 of per-sample time over the last 96 samples;" in line
    assert "fallback" not in line
    line = slow_lane_line(90.0, fallback_from=80.0)
    assert "= p90 of per-sample time over the last 96 samples (fallback from p80: " in line
