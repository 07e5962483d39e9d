"""Writing a benchmark run down: machine-readable JSON and Markdown tables.

``results.json`` holds every run's numbers (schema below, versioned); ``results.md`` one table
per workload with the median and the min-max range over the repeats. Non-finite numbers (an
infinite timeout while headrace was still warming up) are written as ``null``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
from pathlib import Path
from typing import Any

from headrace.bench.config import LoaderSpec
from headrace.bench.measure import RunRecord
from headrace.bench.runner import BenchResult, WorkloadResult
from headrace.bench.summary import METRICS, RowSummary, Spread

SCHEMA_VERSION = 1
JSON_NAME = "results.json"
MARKDOWN_NAME = "results.md"


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _spec_json(spec: LoaderSpec) -> dict[str, Any]:
    return dataclasses.asdict(spec)


def _run_json(r: RunRecord) -> dict[str, Any]:
    out: dict[str, Any] = {name: f(r) for name, f in METRICS.items()}
    out.update(samples=r.samples, batches=r.batches, stall_s=r.stall_s,
               peak_rss_bytes=r.resources.peak_rss_bytes, main_cpu_s=r.resources.main_cpu_s)
    if r.headrace is not None:
        h = r.headrace
        out["headrace"] = {
            "fast_samples": h.fast_samples, "slow_samples": h.slow_samples,
            "timeout_s": h.timeout_s, "timeout_percentile": h.timeout_percentile,
            "main_cpu_per_batch_ms": h.main_cpu_per_batch_ms, "stall_s": h.stall_s,
            "workers_timeline": h.workers, "timeout_timeline": h.timeout,
        }
    return out


def _row_json(row: RowSummary) -> dict[str, Any]:
    return {
        **_spec_json(row.spec),
        "repeats": len(row.runs),
        "metrics": {k: dataclasses.asdict(v) for k, v in row.metrics.items()},
        "headrace": row.extras() or None,
        "runs": [_run_json(r) for r in row.runs],
    }


def workload_json(w: WorkloadResult, plots: dict[str, str] | None = None) -> dict[str, Any]:
    """One workload's entry of ``results.json``."""
    wl = w.workload
    return {
        "name": wl.name,
        "description": wl.description,
        "samples": len(wl),
        "batch_size": wl.batch_size,
        "workers": wl.num_workers,
        "accelerator_step_s": wl.accelerator_step_s,
        "scale": w.scale,
        "best_torch": _spec_json(w.best) if w.best is not None else None,
        "sweep": [{**_spec_json(r.spec), "wall_s": r.wall_s, "vs_ideal": r.vs_ideal,
                   "vs_bound": r.vs_bound} for r in w.sweep],
        "rows": [_row_json(r) for r in w.rows],
        "plots": plots or {},
    }


def write_json(result: BenchResult, out_dir: str | os.PathLike[str],
               plots: dict[str, dict[str, str]] | None = None) -> Path:
    """Write ``results.json`` (atomically) and return its path."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "command": result.command,
        "started": result.started,
        "machine": result.machine,
        "config": dataclasses.asdict(result.config),
        "workloads": [workload_json(w, (plots or {}).get(w.workload.name))
                      for w in result.workloads],
    }
    path = Path(out_dir) / JSON_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_finite(doc), indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


# -- Markdown ---------------------------------------------------------------------------------
def _range(s: Spread, fmt: str, single: bool) -> str:
    return format(s.median, fmt) if single else s.text(fmt)


def _pct(s: Spread, single: bool) -> str:
    if single:
        return f"{100 * s.median:.0f}%"
    return f"{100 * s.median:.0f}% ({100 * s.lo:.0f}–{100 * s.hi:.0f})"


def _config_cell(spec: LoaderSpec) -> str:
    order = "in order" if spec.in_order else "out of order"
    threads = " threads" if spec.executor == "threads" else ""
    return f"{spec.num_workers} w{threads}, pf {spec.prefetch_factor}, {order}"


def workload_table(w: WorkloadResult) -> str:
    """The Markdown table of one workload: median (min–max) over the repeats."""
    head = ("| loader | config | wall s | ÷ ideal | ÷ bound | stall | ideal stall | samples/s "
            "| peak RSS MB | CPU s | main CPU ms/batch |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for row in w.rows:
        m = row.metrics
        one = len(row.runs) == 1
        lines.append(
            f"| {row.label} | {_config_cell(row.spec)} | {_range(m['wall_s'], '.2f', one)} "
            f"| {_range(m['vs_ideal'], '.3f', one)} | {_range(m['vs_bound'], '.3f', one)} "
            f"| {_pct(m['stall_fraction'], one)} | {100 * m['ideal_stall_fraction'].median:.0f}% "
            f"| {m['samples_per_s'].median:.1f} | {m['peak_rss_mb'].median:.0f} "
            f"| {m['cpu_s'].median:.1f} | {m['main_cpu_per_batch_ms'].median:.1f} |"
        )
    return "\n".join(lines)


def workload_section(w: WorkloadResult, plots: dict[str, str] | None = None) -> str:
    """Heading, description, table and notes (headrace's lanes, sweep, plots) of a workload."""
    wl = w.workload
    parts = [f"### {wl.name}", "", wl.description, "", workload_table(w), ""]
    hr_row = next((r for r in w.rows if r.spec.is_headrace_default), None)
    if hr_row is not None and (x := hr_row.extras()):
        empty = x["ready_batches_empty_share"]
        parts.append(
            f"headrace (median over runs): {x['slow_samples']:.0f} of "
            f"{len(wl)} samples via the slow lane, final timeout {x['timeout_ms']:.0f} ms "
            f"(p{x['timeout_percentile']:.0f}), its own main-process CPU "
            f"{x['headrace_main_cpu_per_batch_ms']:.1f} ms/batch"
            + (f", no batch ready in {100 * empty:.0f}% of queue samples" if empty is not None
               else "")
            + f"; inside next(): {x['next_waiting_ms']:.0f} ms waiting for batches, "
            f"{x['next_other_ms']:.0f} ms otherwise (the GIL held by the scheduler thread, "
            "bookkeeping)."
        )
    for row in w.rows:
        if row.spec.executor == "threads" and hr_row is not None and row.runs and hr_row.runs:
            a, b = (statistics.median(math.fsum(run.costs) for run in r.runs)
                    for r in (row, hr_row))
            wall = row.metrics["wall_s"].median
            walls = wall / hr_row.metrics["wall_s"].median
            common = wall / statistics.median(r.ideal_s for r in hr_row.runs)
            parts.append(
                f"{row.label}: wall {walls:.2f}× the headrace row's, {common:.3f}× the headrace "
                f"row's ideal; its per-sample costs sum "
                f"to {a:.2f} s, against {b:.2f} s for the headrace row ({100 * (a / b - 1):+.0f}%; "
                "medians over runs). Steps waiting for the GIL count in its costs and raise its "
                "own ideal: compare its wall time."
            )
    steps = [r.metrics["consumer_step_ms"].median for r in w.rows]
    other = [r.metrics["machine_other_cpu_s"].median / r.metrics["wall_s"].median
             for r in w.rows if r.metrics["wall_s"].median > 0]
    cores = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    parts.append(
        f"Consumer step: nominal {1000 * wl.accelerator_step_s:.1f} ms, measured "
        f"{min(steps):.1f}-{max(steps):.1f} ms per batch (row medians). Other processes on "
        f"the machine used {100 * min(other) / cores:.0f}-{100 * max(other) / cores:.0f}% of "
        f"its {cores} cores during the runs (row medians)."
    )
    if w.sweep:
        tried = ", ".join(f"{r.spec.num_workers} w/pf {r.spec.prefetch_factor}: {r.wall_s:.2f} s"
                          for r in w.sweep)
        parts.append(f"torch sweep (out of order, one epoch each): {tried}.")
    if plots:
        parts.append("Plots: " + ", ".join(f"[{k}]({v})" for k, v in plots.items()) + ".")
    return "\n".join(parts) + "\n"


def render_markdown(result: BenchResult, plots: dict[str, dict[str, str]] | None = None) -> str:
    """The whole run as Markdown: command, machine, one section per workload."""
    mach = result.machine
    cfg = result.config
    blas = mach.get("blas_threads")
    blas_counts = sorted(set(blas.values())) if isinstance(blas, dict) else []
    head = [
        "## Results",
        "",
        f"Command: `{result.command}`  ",
        f"Started: {result.started} (UTC)  ",
        f"Machine: {mach.get('cpus')} CPUs ({mach.get('cpus_usable')} usable), "
        f"{mach.get('memory_gb')} GB, {mach.get('platform')}, Python {mach.get('python')}, "
        f"torch {mach.get('torch')}, start method {mach.get('start_method')}  ",
        f"headrace revision: {mach.get('headrace_revision')}; NumPy OpenBLAS threads: "
        f"{blas_counts or 'default'}  ",
        f"Repeats: {cfg.repeats} per row after {'a' if cfg.warmup else 'no'} warm-up epoch; "
        f"time_scale {cfg.time_scale:g}; cells are median (min–max) over the repeats.",
        "",
    ]
    body = [workload_section(w, (plots or {}).get(w.workload.name)) for w in result.workloads]
    return "\n".join(head) + "\n" + "\n".join(body)


def write_markdown(result: BenchResult, out_dir: str | os.PathLike[str],
                   plots: dict[str, dict[str, str]] | None = None) -> Path:
    """Write ``results.md`` and return its path."""
    path = Path(out_dir) / MARKDOWN_NAME
    path.write_text(render_markdown(result, plots))
    return path


# -- docs -------------------------------------------------------------------------------------
DOC_BEGIN = "<!-- headrace-bench:begin -->"
DOC_END = "<!-- headrace-bench:end -->"


def splice_into_doc(doc: str | os.PathLike[str], markdown: str,
                    out_dir: str | os.PathLike[str]) -> Path:
    """Replace the block between :data:`DOC_BEGIN` and :data:`DOC_END` in ``doc`` by
    ``markdown`` (a run's ``results.md``), with plot links made relative to the document.

    Raises ValueError when the markers are missing, so a document is never silently rewritten.
    """
    path = Path(doc)
    text = path.read_text()
    start, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no {DOC_BEGIN} ... {DOC_END} block to replace")
    rel = Path(os.path.relpath(Path(out_dir).resolve(), path.parent.resolve())).as_posix()
    block = re.sub(r"\]\(([\w.\-]+\.png)\)", lambda m: f"]({rel}/{m.group(1)})", markdown)
    path.write_text(f"{text[:start]}{DOC_BEGIN}\n{block.strip()}\n{text[end:]}")
    return path
