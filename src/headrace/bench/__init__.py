"""headrace.bench: headrace vs torch's DataLoader, side by side, with the physical yardsticks.

======================  ======================================================================
module                  role
======================  ======================================================================
``yardsticks``          the ideal pipeline and the work-conserving bound (pure functions)
``config``              loader rows (:class:`LoaderSpec`), run settings, quick/full presets
``resources``           peak RSS and CPU-seconds of a run (sampling thread, getrusage)
``threads``             NumPy's OpenBLAS limited to one thread for the run (no oversubscription)
``minimal``             the reference row: threads that only run the steps and fill batches
``measure``             one measured epoch with a simulated accelerator; exactly-once check
``summary``             median and min-max over repeats
``runner``              warm-up, torch sweep, round-robin repeats over every workload
``report``              ``results.json``, ``results.md``, and the block in ``docs/benchmarks.md``
``plots``               PNG plots: throughput/stall timeline, cost CDF, headrace's controls
``demo``                ``headrace demo``: a small model trained with both loaders
======================  ======================================================================

``run_and_write(config)`` is what ``headrace bench`` runs.
"""

from __future__ import annotations

from pathlib import Path

from headrace.bench.config import BenchConfig, LoaderSpec, full_config, quick_config
from headrace.bench.measure import ExactlyOnceError, RunRecord, run_once
from headrace.bench.runner import BenchResult, Log, WorkloadResult, run_bench

__all__ = [
    "BenchConfig",
    "BenchResult",
    "ExactlyOnceError",
    "LoaderSpec",
    "RunRecord",
    "WorkloadResult",
    "full_config",
    "quick_config",
    "run_and_write",
    "run_bench",
    "run_once",
    "write_outputs",
]


def write_outputs(result: BenchResult, out_dir: str | Path, plots: bool = True) -> dict[str, Path]:
    """Write PNGs (optional), ``results.json`` and ``results.md`` into ``out_dir``.

    Returns ``{"json": path, "markdown": path, "dir": out_dir}``.
    """
    from headrace.bench.report import write_json, write_markdown

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, str]] = {}
    if plots:
        from headrace.bench.plots import write_plots

        files = write_plots(result, out)
    return {
        "json": write_json(result, out, files),
        "markdown": write_markdown(result, out, files),
        "dir": out,
    }


def run_and_write(
    config: BenchConfig, command: str = "", log: Log = lambda _m: None
) -> tuple[BenchResult, dict[str, Path]]:
    """Run the benchmark described by ``config`` and write its outputs to ``config.out_dir``.

    The JSON and Markdown are rewritten after every workload, so an interrupted run keeps the
    workloads it finished; plots are drawn once at the end.
    """

    def partial(r: BenchResult) -> None:
        write_outputs(r, config.out_dir, plots=False)

    result = run_bench(config, command, log, on_workload=partial)
    return result, write_outputs(result, config.out_dir, config.plots)
