"""PNG plots of a benchmark run (matplotlib, Agg backend: no display needed).

Per workload, from each row's typical run (median wall ÷ ideal):

* ``<name>-timeline.png``: throughput (samples/s) and consumer stall (share of each time bin
  spent waiting in ``next()``) over the epoch, one line per loader;
* ``<name>-cost-cdf.png``: CDF of the per-sample preprocessing time each loader measured;
* ``<name>-headrace.png``: headrace's worker count, hand-off timeout and queue depths over time.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from headrace.bench.measure import RunRecord
from headrace.bench.runner import BenchResult, WorkloadResult

BINS = 40
"""Time bins across the longest run in the timeline plot."""


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def throughput_and_stall(run: RunRecord, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per time bin (``edges`` in seconds): samples/s delivered and the share spent stalled."""
    width = np.diff(edges)
    samples = np.zeros(len(width))
    stall = np.zeros(len(width))
    for t, waited, n in run.batch_times:
        k = min(int(np.searchsorted(edges, t, side="right")) - 1, len(width) - 1)
        if k >= 0:
            samples[k] += n
        lo, hi = t - waited, t
        overlap = np.clip(np.minimum(edges[1:], hi) - np.maximum(edges[:-1], lo), 0.0, None)
        stall += overlap
    return samples / width, stall / width


def plot_timeline(w: WorkloadResult, path: Path) -> None:
    """Throughput and stall over time, one line per loader (typical runs)."""
    plt = _pyplot()
    runs = [(row.label, row.typical) for row in w.rows]
    t_max = max(r.wall_s for _, r in runs)
    edges = np.linspace(0.0, t_max, BINS + 1)
    mid = (edges[:-1] + edges[1:]) / 2
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    for label, r in runs:
        rate, stall = throughput_and_stall(r, edges)
        alive = mid <= r.wall_s
        ax1.plot(mid[alive], rate[alive], label=f"{label} ({r.wall_s:.1f} s, "
                 f"{r.vs_ideal:.2f}× ideal)")
        ax2.plot(mid[alive], 100 * stall[alive], label=label)
    ax1.set_ylabel("samples/s delivered")
    ax1.set_title(f"{w.workload.name}: throughput and consumer stall over the epoch")
    ax1.legend(fontsize=8)
    ax2.set_ylabel("consumer stalled (% of bin)")
    ax2.set_xlabel("seconds since iter(loader)")
    ax2.set_ylim(-2, 102)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cost_cdf(w: WorkloadResult, path: Path) -> None:
    """CDF of per-sample preprocessing time (ms), one line per loader (typical runs)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for row in w.rows:
        c = np.sort(1000.0 * np.asarray(row.typical.costs))
        ax.step(c, np.arange(1, len(c) + 1) / len(c), where="post", label=row.label)
    ax.set_xscale("log")
    ax.set_xlabel("per-sample preprocessing time (ms, log scale; load + every step)")
    ax.set_ylabel("fraction of samples ≤ x")
    ax.set_title(f"{w.workload.name}: per-sample preprocessing time (CDF)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_headrace(w: WorkloadResult, path: Path) -> bool:
    """headrace's workers, timeout and queues over time; False when no headrace row ran."""
    row = next((r for r in w.rows if r.spec.kind == "headrace" and not r.spec.in_order), None)
    if row is None or row.typical.headrace is None:
        return False
    tr = row.typical.headrace
    end = row.typical.wall_s
    plt = _pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    wt = [(max(t, 0.0), n) for t, n in tr.workers] or [(0.0, row.spec.num_workers)]
    ax1.step([t for t, _ in wt] + [end], [n for _, n in wt] + [wt[-1][1]], where="post")
    ax1.set_ylabel("worker processes")
    ax1.set_ylim(0, max(n for _, n in wt) + 1)
    ax1.set_title(f"{w.workload.name}: headrace's workers, hand-off timeout and queues")
    to = [(max(t, 0.0), v) for t, v in tr.timeout if math.isfinite(v)]
    if to:
        ax2.step([t for t, _ in to] + [end], [1000 * v for _, v in to] + [1000 * to[-1][1]],
                 where="post")
        first = to[0][0]
        ax2.axvspan(0, first, color="0.9", label="warm-up: no hand-off")
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "timeout never set (still warming up)", ha="center",
                 transform=ax2.transAxes)
    ax2.set_ylabel("hand-off timeout (ms)")
    if tr.queues:
        q = np.asarray(tr.queues, dtype=float)
        for col, name in ((1, "ready batches"), (2, "ready samples"), (3, "in flight"),
                          (4, "slow backlog")):
            ax3.plot(q[:, 0], q[:, col], label=name)
        ax3.legend(fontsize=8)
    ax3.set_ylabel("queue depth")
    ax3.set_xlabel("seconds since iter(loader)")
    ax3.set_xlim(0, end)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_plots(result: BenchResult, out_dir: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """Write every workload's PNGs; returns ``{workload: {plot kind: file name}}``."""
    out = Path(out_dir)
    written: dict[str, dict[str, str]] = {}
    for w in result.workloads:
        name = w.workload.name
        files = {"timeline": f"{name}-timeline.png", "cost CDF": f"{name}-cost-cdf.png"}
        plot_timeline(w, out / files["timeline"])
        plot_cost_cdf(w, out / files["cost CDF"])
        hr_file = f"{name}-headrace.png"
        if plot_headrace(w, out / hr_file):
            files["headrace workers/timeout"] = hr_file
        written[name] = files
    return written
