"""Aggregating repeated runs of one loader: median and spread (min-max) of every metric."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from headrace.bench.config import LoaderSpec
from headrace.bench.measure import RunRecord

METRICS: dict[str, Callable[[RunRecord], float]] = {
    "wall_s": lambda r: r.wall_s,
    "ideal_s": lambda r: r.ideal_s,
    "bound_s": lambda r: r.bound_s,
    "vs_ideal": lambda r: r.vs_ideal,
    "vs_bound": lambda r: r.vs_bound,
    "stall_fraction": lambda r: r.stall_fraction,
    "ideal_stall_fraction": lambda r: r.ideal_stall_fraction,
    "samples_per_s": lambda r: r.samples_per_s,
    "peak_rss_mb": lambda r: r.resources.peak_rss_bytes / 1e6,
    "cpu_s": lambda r: r.resources.cpu_s,
    "main_cpu_per_batch_ms": lambda r: r.main_cpu_per_batch_ms,
    "machine_other_cpu_s": lambda r: max(0.0, r.resources.machine_busy_s - r.resources.cpu_s),
    "mean_cost_ms": lambda r: 1000.0 * statistics.fmean(r.costs) if r.costs else 0.0,
    "consumer_step_ms": lambda r: 1000.0 * r.consumer_busy_s / r.batches if r.batches else 0.0,
}
"""Every metric reported per run, by name (units in the name: s, ms, mb; ratios bare)."""


@dataclasses.dataclass(frozen=True)
class Spread:
    """Median and range of one metric over the repeats."""

    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def text(self, fmt: str) -> str:
        """``median (min–max)``, each number formatted with ``fmt`` (e.g. ``".2f"``)."""
        return f"{format(self.median, fmt)} ({format(self.lo, fmt)}–{format(self.hi, fmt)})"


@dataclasses.dataclass(frozen=True)
class RowSummary:
    """One loader's row: its configuration, every metric's spread, and its runs.

    ``typical`` is the run whose wall ÷ ideal is the median (the lower middle for an even
    count): plots show it.
    """

    spec: LoaderSpec
    metrics: dict[str, Spread]
    runs: tuple[RunRecord, ...]

    @property
    def label(self) -> str:
        return self.spec.label

    @property
    def typical(self) -> RunRecord:
        ranked = sorted(self.runs, key=lambda r: r.vs_ideal)
        return ranked[(len(ranked) - 1) // 2]

    def extras(self) -> dict[str, Any]:
        """headrace's own numbers (median over runs), empty for torch rows."""
        pairs = [(r, t) for r in self.runs if (t := r.headrace) is not None]
        traces = [t for _, t in pairs]
        if not traces:
            return {}
        med = statistics.median
        starved = [
            sum(q[1] == 0 for q in t.queues) / len(t.queues) for t in traces if t.queues
        ]
        # the consumer's time inside next() (the harness's stall) is headrace's own wait for a
        # batch, and the rest: the training thread waiting for the GIL the scheduler thread
        # holds, or its own bookkeeping (marking delivered, reading the sampler)
        waits = [(t.stall_s, r.stall_s - t.stall_s) for r, t in pairs]
        return {
            "slow_samples": med([t.slow_samples for t in traces]),
            "fast_samples": med([t.fast_samples for t in traces]),
            "timeout_ms": med([1000.0 * t.timeout_s for t in traces]),
            "timeout_percentile": traces[-1].timeout_percentile,
            "headrace_main_cpu_per_batch_ms": med([t.main_cpu_per_batch_ms for t in traces]),
            "ready_batches_empty_share": med(starved) if starved else None,
            "max_slow_backlog": max(max((q[4] for q in t.queues), default=0) for t in traces),
            "next_waiting_ms": med([1000.0 * w for w, _ in waits]),
            "next_other_ms": med([1000.0 * max(0.0, o) for _, o in waits]),
        }


def summarize(spec: LoaderSpec, runs: Sequence[RunRecord]) -> RowSummary:
    """The row of ``spec`` from its measured ``runs`` (at least one)."""
    if not runs:
        raise ValueError(f"no runs for {spec.label}")
    metrics = {name: Spread.of([f(r) for r in runs]) for name, f in METRICS.items()}
    return RowSummary(spec, metrics, tuple(runs))
