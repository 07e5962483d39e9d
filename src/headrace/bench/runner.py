"""Running the comparison: every loader on every workload, in one process and one run.

Per workload: build it at the configured scale, fix one sampler permutation, run one discarded
warm-up epoch (page cache, lazy imports, generated files), run torch's worker/prefetch sweep
(one epoch per configuration), then ``repeats`` rounds over every row. Rounds go round-robin,
starting one row later each round, so a burst of load from another process on this shared
machine hits every loader alike instead of one row's repeats.

Two settings hold for the whole run (``BenchConfig``): NumPy's OpenBLAS is limited to
``blas_threads`` threads (``runtime/native_threads.py`` says why), and headrace gets a profile store private to
the run, so its measured epochs start from the profile the warm-up stored, as a user's second
run of the same job does.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headrace.bench.config import (
    SWEEP_PREFETCH,
    BenchConfig,
    LoaderSpec,
    standard_loaders,
    sweep_workers,
)
from headrace.bench.measure import RunRecord, run_once
from headrace.bench.summary import RowSummary, summarize
from headrace.runtime.native_threads import blas_limited
from headrace.workloads import Workload, get_workload

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class WorkloadResult:
    """Every row of one workload, plus the sweep that chose torch's best configuration.

    Attributes:
        workload: the workload as run (its ``num_workers`` is the shared worker budget).
        scale: samples per epoch as a factor of the workload's base count.
        rows: one per loader, in report order (headrace rows first).
        sweep: one run per torch configuration tried (empty without a sweep).
        best: the sweep's fastest configuration (``None`` without a sweep).
    """

    workload: Workload
    scale: float
    rows: tuple[RowSummary, ...]
    sweep: tuple[RunRecord, ...]
    best: LoaderSpec | None

    def row(self, label: str) -> RowSummary:
        """The row named ``label``."""
        for r in self.rows:
            if r.label == label:
                return r
        raise KeyError(label)


@dataclasses.dataclass(frozen=True)
class BenchResult:
    """A whole benchmark run: its settings, the machine, and every workload's rows."""

    config: BenchConfig
    machine: dict[str, object]
    command: str
    started: str
    workloads: tuple[WorkloadResult, ...]


def _git_revision() -> str | None:
    """``git describe``-like revision of the headrace checkout (``-dirty`` if modified)."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src"],
                               capture_output=True, text=True, timeout=5, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("-dirty" if dirty.strip() else "")


def machine_info() -> dict[str, object]:
    """Cores, memory, software versions and headrace revision of the machine the run is on."""
    import psutil

    from headrace.runtime.native_threads import blas_threads

    return {
        "headrace_revision": _git_revision(),
        "blas_threads": blas_threads(),
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "start_method": torch.multiprocessing.get_start_method(),
    }


def build_workload(name: str, config: BenchConfig) -> Workload:
    """Workload ``name`` at the configured scale, with the worker override applied."""
    wl = get_workload(
        name,
        scale=config.scale_of(name),
        time_scale=config.time_scale,
        seed=config.seed,
        cache_dir=config.cache_dir,
        num_samples=config.num_samples,
    )
    if config.num_workers is not None:
        wl = dataclasses.replace(wl, num_workers=config.num_workers)
    return wl


def sampler_order(n: int, seed: int) -> list[int]:
    """The fixed epoch order every loader gets: a seeded permutation of ``range(n)``."""
    return [int(i) for i in np.random.default_rng([seed, 7]).permutation(n)]


def bench_workload(
    name: str, config: BenchConfig, log: Log = lambda _m: None, options: Any = None
) -> WorkloadResult:
    """Measure every row on workload ``name`` (see the module docstring).

    ``options``: :class:`headrace.Options` for the headrace rows (``None``: the defaults).
    """
    wl = build_workload(name, config)
    order = sampler_order(len(wl), config.seed)
    log(f"== {name}: {len(wl)} samples, batch {wl.batch_size}, {wl.num_workers} workers, "
        f"accelerator {wl.accelerator_step_s * 1e3:g} ms/batch")
    specs = standard_loaders(wl.num_workers)

    def measure(spec: LoaderSpec, tag: str) -> RunRecord:
        r = run_once(wl, spec, order, config.resource_interval_s, options=options)
        log(f"  {tag:<8} {spec.label:<20} wall {r.wall_s:7.2f} s  ÷ideal {r.vs_ideal:5.3f}  "
            f"÷bound {r.vs_bound:5.3f}  stall {r.stall_fraction:5.1%}")
        return r

    if config.warmup:
        measure(specs[0], "warm-up")
    sweep: list[RunRecord] = []
    best: LoaderSpec | None = None
    if config.sweep:
        sweep, best = _sweep(wl, measure)
        specs.append(best)
    runs: dict[str, list[RunRecord]] = {s.label: [] for s in specs}
    for k in range(config.repeats):
        shift = k % len(specs)
        for spec in specs[shift:] + specs[:shift]:
            runs[spec.label].append(measure(spec, f"run {k + 1}"))
    rows = tuple(summarize(s, runs[s.label]) for s in specs)
    return WorkloadResult(wl, config.scale_of(name), rows, tuple(sweep), best)


def _sweep(
    wl: Workload, measure: Callable[[LoaderSpec, str], RunRecord]
) -> tuple[list[RunRecord], LoaderSpec]:
    """torch out-of-order at half, equal and twice the worker budget (prefetch 2), then the
    other prefetch factors at the fastest worker count; one epoch each. Returns the runs and
    the fastest configuration, labelled ``"torch best"``."""
    runs: list[RunRecord] = []

    def spec(workers: int, prefetch: int) -> LoaderSpec:
        return LoaderSpec(f"torch w{workers} pf{prefetch}", "torch", workers, prefetch, False)

    for w in sweep_workers(wl.num_workers):
        runs.append(measure(spec(w, SWEEP_PREFETCH[0]), "sweep"))
    best_w = min(runs, key=lambda r: r.wall_s).spec.num_workers
    for pf in SWEEP_PREFETCH[1:]:
        runs.append(measure(spec(best_w, pf), "sweep"))
    fastest = min(runs, key=lambda r: r.wall_s).spec
    return runs, dataclasses.replace(fastest, label="torch best")


def run_bench(
    config: BenchConfig,
    command: str = "",
    log: Log = lambda _m: None,
    on_workload: Callable[[BenchResult], None] | None = None,
) -> BenchResult:
    """Run every configured workload; returns all rows (nothing written: see ``report``).

    ``on_workload(partial)`` is called after each workload with the results so far, so a
    caller can write them down before a long run ends.
    """
    from headrace.runtime import Options

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    done: list[WorkloadResult] = []
    with blas_limited(config.blas_threads), \
            tempfile.TemporaryDirectory(prefix="headrace-bench-") as tmp:
        result = BenchResult(config, machine_info(), command or " ".join(sys.argv), started, ())
        store = str(Path(tmp) / "profiles.sqlite") if config.profile_store else False
        # One-epoch rows compare loaders at equal work: the sample cache only pays from the
        # second epoch (its own benchmark: ``headrace cachebench``), so it is off here.
        options = Options(profile_store=store, cache=None)
        for name in config.workloads:
            done.append(bench_workload(name, config, log, options))
            result = dataclasses.replace(result, workloads=tuple(done))
            if on_workload is not None:
                on_workload(result)
    return result
