"""What ``headrace profile`` prints and draws: the per-step table, a text histogram of
per-sample times with the slow threshold marked, and the same histogram as a PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headrace import units

HIST_BINS = 12
"""Rows of the text histogram (plus one where the threshold splits a bin)."""


def step_table(profile: Any) -> list[str]:
    """Rows of the per-step table of a ``PipelineProfile`` (times per sample, bytes per sample)."""
    head = (f"  {'step':<20}{'p50':>10}{'p90':>10}{'cpu mean':>10}{'bytes in':>11}"
            f"{'bytes out':>11}{'inflation':>11}  p10-p90")
    rows = [head]
    for s in profile.steps:
        infl = f"{s.inflation:.2f}" if s.inflation is not None else "-"
        spread = (f"{s.inflation_p10:.2f}-{s.inflation_p90:.2f}"
                  if s.inflation_p10 is not None and s.inflation_p90 is not None else "-")
        flag = "  (changes type)" if s.changes_type else ""
        rows.append(f"  {s.name:<20}{units.duration(s.wall_p50):>10}{units.duration(s.wall_p90):>10}"
                    f"{units.duration(s.cpu_mean):>10}{units.size(s.bytes_in_mean):>11}{units.size(s.bytes_out_mean):>11}"
                    f"{infl:>11}  {spread}{flag}")
    return rows


def histogram_text(times: Sequence[float], threshold: float, bins: int = HIST_BINS,
                   width: int = 40) -> list[str]:
    """A text histogram of per-sample times (seconds) with a line at ``threshold``.

    Bins are linear, or logarithmic when the slowest sample is over 20× the fastest; the
    threshold is made a bin edge so the marker line separates fast from slow exactly.
    """
    x = np.asarray(times, dtype=np.float64)
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:
        hi = lo + max(lo * 0.01, 1e-6)
    log = lo > 0 and hi / lo > 20
    edges = np.geomspace(lo, hi, bins + 1) if log else np.linspace(lo, hi, bins + 1)
    if lo < threshold < hi:
        edges = np.unique(np.append(edges, threshold))
    counts, _ = np.histogram(x, edges)
    top = max(1, int(counts.max()))
    rows = [_marker(threshold)] if threshold <= lo else []
    for k, c in enumerate(counts):
        if k and edges[k] == threshold:
            rows.append(_marker(threshold))
        bar = "#" * max(1, round(width * c / top)) if c else ""
        rows.append(f"  {units.duration(edges[k]):>9} - {units.duration(edges[k + 1]):>9} |{bar:<{width}} {c}")
    if threshold >= hi:
        rows.append(_marker(threshold))
    return rows


def _marker(threshold: float) -> str:
    return f"  {'-' * 24} slow threshold {units.duration(threshold)} {'-' * 24}"


def write_png(times: Sequence[float], threshold: float, label: str, path: Path,
              title: str) -> Path:
    """Histogram of per-sample times (ms) with the threshold as a vertical line (Agg backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ms = np.asarray(times, dtype=np.float64) * 1e3
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    lo, hi = float(ms.min()), float(ms.max())
    if lo > 0 and hi / lo > 20:
        ax.hist(ms, bins=list(np.geomspace(lo, hi, 41)), color="C0")
        ax.set_xscale("log")
    else:
        ax.hist(ms, bins=40, color="C0")
    ax.axvline(threshold * 1e3, color="C3", linestyle="--",
               label=f"slow threshold {threshold * 1e3:.1f} ms\n({label})")
    ax.set_xlabel("per-sample time, load + steps (ms)")
    ax.set_ylabel("samples")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
