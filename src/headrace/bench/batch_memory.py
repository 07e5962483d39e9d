"""Where batch memory comes from: the pool's own pages against NumPy's huge pages.

    python -m headrace.bench.batch_memory [--rounds 5] [workload ...]

headrace assembles batches in buffers from its pool (``runtime/bufferpool.py``), allocated by
``pinning.PageableMemory``. Rows, each a fresh loader's first epoch (as every row of
``headrace bench``: a fresh loader faults its buffers in), interleaved round-robin over the
rounds, on the bench's workloads (default imagenet and objdet) at the bench's scale:
``headrace`` (the pool's anonymous mappings, ordinary pages), ``headrace, NumPy's huge pages``
(the same loader with the buffers from ``np.empty``, which asks for transparent huge pages on
4 MB and more, as before) and torch's DataLoader at equal workers for scale. Prints a Markdown
table: wall seconds and the training process's system CPU seconds (page faults are most of
it), median (min-max) over the rounds.
"""

from __future__ import annotations

import argparse
import resource
import statistics
from collections.abc import Callable

import numpy as np

from headrace.bench.config import BenchConfig, LoaderSpec, full_config, standard_loaders
from headrace.bench.measure import run_once
from headrace.bench.runner import build_workload, sampler_order
from headrace.bench.summary import Spread
from headrace.runtime import Options
from headrace.runtime.pinning import PageableMemory
from headrace.workloads.workload import Workload

ROWS = ("headrace", "headrace, NumPy's huge pages", "torch out_of_order")


def _numpy_pages(_self: PageableMemory, nbytes: int) -> np.ndarray:
    return np.empty(nbytes, dtype=np.uint8)


def _epoch(wl: Workload, spec: LoaderSpec, order: list[int], numpy_pages: bool,
           interval_s: float, options: Options) -> tuple[float, float]:
    """(wall s, training-process system CPU s) of one epoch of a fresh loader."""
    own = PageableMemory.allocate
    if numpy_pages:
        PageableMemory.allocate = _numpy_pages  # type: ignore[method-assign,assignment]
    try:
        s0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        rec = run_once(wl, spec, order, interval_s, options=options)
        return rec.wall_s, resource.getrusage(resource.RUSAGE_SELF).ru_stime - s0
    finally:
        PageableMemory.allocate = own  # type: ignore[method-assign]


def run(workloads: list[str], rounds: int, config: BenchConfig | None = None
        ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{workload: {row: [(wall s, training-process system CPU s), ...]}}``; ``config``: the
    workloads' scale (default: the full bench's)."""
    config = config or full_config(workloads)
    options = Options(profile_store=False, cache=None)
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for name in workloads:
        wl = build_workload(name, config)
        order = sampler_order(len(wl), config.seed)
        specs = {s.label: s for s in standard_loaders(wl.num_workers)}
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in ROWS}
        for r in range(rounds):
            shift = r % len(ROWS)
            for label in ROWS[shift:] + ROWS[:shift]:
                spec = specs["headrace" if label.startswith("headrace") else label]
                res[label].append(_epoch(wl, spec, order, label == ROWS[1],
                                         config.resource_interval_s, options))
        out[name] = res
    return out


def markdown(results: dict[str, dict[str, list[tuple[float, float]]]]) -> str:
    lines = ["| workload | loader | wall s | training-process system CPU s | wall vs headrace |",
             "|---|---|---|---|---|"]
    for name, rows in results.items():
        ours = statistics.median(w for w, _ in rows["headrace"])
        for label, runs in rows.items():
            walls = Spread.of([w for w, _ in runs])
            sys_cpu = Spread.of([s for _, s in runs])
            lines.append(f"| {name} | {label} | {walls.text('.2f')} | {sys_cpu.text('.2f')} | "
                         f"{walls.median / ours:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, emit: Callable[[str], None] = print) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="*", default=["imagenet", "objdet"])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    emit(markdown(run(a.workloads, a.rounds)))


if __name__ == "__main__":
    main()
