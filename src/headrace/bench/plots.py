"""PNG plots of a benchmark run (matplotlib, Agg backend: no display needed).

Per workload, from each row's typical run (median wall ÷ ideal):

* ``<name>-timeline.png``: samples delivered (with the ideal pipeline's curve), throughput
  (samples/s over a sliding window of batches) and cumulative consumer stall over the epoch,
  one line per loader;
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

WINDOW_FRACTION = 0.1
"""The throughput curve averages over this share of an epoch's batches (at least 2)."""


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def delivery_curves(run: RunRecord) -> dict[str, np.ndarray]:
    """Per batch of ``run``: arrival time ``t`` (s), cumulative ``samples`` and ``stall`` (s),
    and ``rate``, samples/s over the preceding window of batches (NaN before the first window).
    """
    bt = np.asarray(run.batch_times, dtype=float).reshape(-1, 3)
    t, waited, n = bt[:, 0], bt[:, 1], bt[:, 2]
    samples = np.cumsum(n)
    m = max(2, int(len(t) * WINDOW_FRACTION))
    rate = np.full(len(t), np.nan)
    if len(t) > m:
        dt = t[m:] - t[:-m]
        rate[m:] = np.where(dt > 0, (samples[m:] - samples[:-m]) / np.maximum(dt, 1e-9), np.nan)
    return {"t": t, "samples": samples, "stall": np.cumsum(waited), "rate": rate}


def plot_timeline(w: WorkloadResult, path: Path) -> None:
    """Samples delivered, throughput and cumulative stall over time, one line per loader."""
    plt = _pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for row in w.rows:
        r = row.typical
        c = delivery_curves(r)
        line = ax1.step(np.r_[0.0, c["t"], r.wall_s], np.r_[0, c["samples"], c["samples"][-1:]],
                        where="post", label=f"{row.label} ({r.wall_s:.1f} s, "
                        f"{r.vs_ideal:.2f}× ideal)")[0]
        if row.spec.is_headrace_default and r.ideal_batch_start_s:
            k = np.arange(1, len(r.ideal_batch_start_s) + 1)
            ideal_n = np.minimum(k * w.workload.batch_size, len(r.costs))
            ax1.step(np.r_[0.0, r.ideal_batch_start_s, r.ideal_s], np.r_[0, ideal_n, ideal_n[-1]],
                     where="post", ls="--", color=line.get_color(), alpha=0.6,
                     label=f"ideal on {row.label}'s order and costs ({r.ideal_s:.1f} s)")
        ax2.plot(c["t"], c["rate"], color=line.get_color(), label=row.label)
        ax3.step(np.r_[0.0, c["t"]], np.r_[0.0, c["stall"]], where="post",
                 color=line.get_color(), label=row.label)
    ax1.set_ylabel("samples delivered")
    ax1.set_title(f"{w.workload.name}: delivery, throughput and consumer stall over the epoch")
    ax1.legend(fontsize=8)
    ax2.set_ylabel(f"samples/s (window {WINDOW_FRACTION:.0%} of batches)")
    ax3.set_ylabel("consumer stall so far (s)")
    ax3.set_xlabel("seconds since iter(loader)")
    for ax in (ax1, ax2, ax3):
        ax.grid(True, alpha=0.3)
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
    row = next((r for r in w.rows if r.spec.is_headrace_default), None)
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
