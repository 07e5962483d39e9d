"""What a benchmark run compares and at which size: loader specs and run settings.

A :class:`LoaderSpec` names one loader configuration (headrace or torch, workers, prefetch,
ordering); a :class:`BenchConfig` says which workloads run, at which scale, how many times.
The presets (:func:`quick_config`, :func:`full_config`) fix the scales that make ``headrace bench
--quick`` take a few minutes and ``headrace bench`` at most about 15 minutes on 2 cores.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from headrace.workloads import WORKLOADS

LoaderKind = Literal["headrace", "torch", "minimal"]

FULL_SCALES: dict[str, float] = {
    "speech-3s": 1.0,
    "speech-10s": 0.4,
    "imseg": 0.5,
    "objdet": 0.4,
    "imagenet": 0.5,
}
"""Samples per epoch as a factor of each workload's base count, for the full run."""

QUICK_SCALES: dict[str, float] = {
    "speech-3s": 0.25,
    "speech-10s": 0.2,
    "imseg": 0.25,
    "objdet": 0.2,
    "imagenet": 0.1,
}
"""Scales of ``--quick``: every workload in under a minute on 2 cores (a smoke run: at these
sizes worker start-up and the first batch's fill weigh on every ratio)."""


@dataclasses.dataclass(frozen=True)
class LoaderSpec:
    """One loader configuration of a benchmark row.

    Attributes:
        label: row name in tables, JSON and plots (unique within a workload).
        kind: ``"headrace"`` (``headrace.DataLoader`` on the pipeline), ``"torch"``
            (``torch.utils.data.DataLoader`` on the pipeline as a map-style dataset) or
            ``"minimal"`` (the reference loader of ``bench/minimal.py``: threads that run the
            steps and collate, nothing else).
        num_workers: workers (processes, or threads with ``executor="threads"``).
        prefetch_factor: batches prefetched per worker (torch's meaning; headrace derives
            its in-flight bound from it).
        in_order: torch's keyword: ``True`` yields batches in sampler order.
        executor: ``"processes"`` or ``"threads"``: for headrace rows ``Options(executor=)``;
            the minimal row always runs threads and says so.
        auto_workers: headrace rows only: ``num_workers="auto"`` (the adaptive worker count;
            ``num_workers`` is then the budget the row's yardsticks are computed with).
        persistent_workers: torch's keyword (workers kept between epochs), for runs of
            several epochs.
    """

    label: str
    kind: LoaderKind
    num_workers: int
    prefetch_factor: int = 2
    in_order: bool = True
    executor: str = "processes"
    auto_workers: bool = False
    persistent_workers: bool = False

    @property
    def is_headrace_default(self) -> bool:
        """The row of headrace's defaults (out of order, worker processes): the one the notes
        and plots single out."""
        return (self.kind == "headrace" and not self.in_order and self.executor == "processes"
                and not self.auto_workers)

    def describe(self) -> str:
        """Short configuration text: ``"12 workers, prefetch 2, in_order=False"``."""
        threads = ", threads" if self.executor == "threads" else ""
        workers = (f'num_workers="auto" (budget {self.num_workers})' if self.auto_workers
                   else f"{self.num_workers} workers")
        persistent = ", persistent_workers" if self.persistent_workers else ""
        return (
            f"{workers}{threads}, prefetch {self.prefetch_factor}, "
            f"in_order={self.in_order}{persistent}"
        )


def standard_loaders(workers: int, prefetch_factor: int = 2) -> list[LoaderSpec]:
    """The rows every workload reports, all with the same worker budget (``headrace auto``
    chooses its own count: the budget is only its yardsticks' worker count)."""
    return [
        LoaderSpec("headrace", "headrace", workers, prefetch_factor, in_order=False),
        LoaderSpec("headrace auto", "headrace", workers, prefetch_factor, in_order=False,
                   auto_workers=True),
        LoaderSpec("headrace in_order", "headrace", workers, prefetch_factor, in_order=True),
        LoaderSpec("headrace threads", "headrace", workers, prefetch_factor, in_order=False,
                   executor="threads"),
        LoaderSpec("torch in_order", "torch", workers, prefetch_factor, in_order=True),
        LoaderSpec("torch out_of_order", "torch", workers, prefetch_factor, in_order=False),
        LoaderSpec("minimal (reference)", "minimal", workers, prefetch_factor, in_order=False,
                   executor="threads"),
    ]


def sweep_workers(workers: int) -> list[int]:
    """Worker counts the torch sweep tries: half, the budget, and twice the budget."""
    return sorted({max(1, workers // 2), workers, 2 * workers})


SWEEP_PREFETCH: tuple[int, ...] = (2, 4)
"""Prefetch factors the sweep tries (the second only at the best worker count)."""


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Settings of one benchmark run.

    Attributes:
        workloads: workload names, in report order.
        scales: per workload, samples per epoch as a factor of its base count.
        time_scale: factor on simulated step times (speech's sleeps and accelerator step).
        repeats: measured runs per loader (the median and spread are reported).
        warmup: run one discarded epoch per workload first (page cache, lazy imports).
        sweep: run torch's ``num_workers``/``prefetch_factor`` sweep and add its best row.
        num_workers: override of every workload's worker budget (``None``: the paper's).
        num_samples: override of every workload's epoch size (``None``: from ``scales``).
        seed: dataset seed and seed of the fixed sampler permutation.
        cache_dir: where generated JPEG sets live (``None``: the workloads' default).
        out_dir: where JSON, Markdown and PNGs are written.
        resource_interval_s: seconds between two RSS samples of the loader's processes.
        plots: write PNG plots.
        profile_store: give headrace a profile store private to this benchmark run (a temp
            file): the warm-up epoch fills it and later headrace runs start from it, as a
            user's second run of the same job does. ``False``: every headrace run starts cold
            (no stored profile, timeout learned from scratch).
        blas_threads: threads of NumPy's OpenBLAS in the benchmark process and the workers
            torch's DataLoader forks (``0``: leave the library default, one per core, as
            users have it). headrace's worker processes set their own from
            ``Options(worker_blas_threads)`` (default 1). See ``runtime/native_threads.py``.
    """

    workloads: tuple[str, ...] = WORKLOADS
    scales: dict[str, float] = dataclasses.field(default_factory=lambda: dict(FULL_SCALES))
    time_scale: float = 0.1
    repeats: int = 3
    warmup: bool = True
    sweep: bool = True
    num_workers: int | None = None
    num_samples: int | None = None
    seed: int = 0
    cache_dir: str | None = None
    out_dir: str = "bench-out"
    resource_interval_s: float = 0.1
    plots: bool = True
    profile_store: bool = True
    blas_threads: int = 1

    def __post_init__(self) -> None:
        unknown = [w for w in self.workloads if w not in WORKLOADS]
        if unknown:
            raise ValueError(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")

    def scale_of(self, workload: str) -> float:
        """Scale of ``workload`` (1.0 when the preset does not name it)."""
        return self.scales.get(workload, 1.0)


def full_config(workloads: Sequence[str] = (), **overrides: object) -> BenchConfig:
    """The full run: 3 repeats after a warm-up, torch sweep, :data:`FULL_SCALES`."""
    return BenchConfig(workloads=tuple(workloads) or WORKLOADS, **overrides)  # type: ignore[arg-type]


def quick_config(workloads: Sequence[str] = (), **overrides: object) -> BenchConfig:
    """``--quick``: :data:`QUICK_SCALES`, one repeat after a warm-up, no sweep."""
    base: dict[str, object] = {"scales": dict(QUICK_SCALES), "repeats": 1, "sweep": False}
    base.update(overrides)
    return BenchConfig(workloads=tuple(workloads) or WORKLOADS, **base)  # type: ignore[arg-type]
