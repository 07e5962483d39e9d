"""Where batch memory comes from: the pool's own pages against NumPy's huge pages.

    python -m headrace.bench.batch_memory [--rounds 5] [workload ...]
    python -m headrace.bench.batch_memory --epochs 4 [--rounds 3] [workload ...]

headrace assembles batches in buffers from its pool (``runtime/bufferpool.py``), allocated by
``pinning.PageableMemory``. Rows, each a fresh loader's first epoch (as every row of
``headrace bench``: a fresh loader faults its buffers in), interleaved round-robin over the
rounds, on the bench's workloads (default imagenet and objdet) at the bench's scale:
``headrace`` (the pool's anonymous mappings, ordinary pages), ``headrace, NumPy's huge pages``
(the same loader with the buffers from ``np.empty``, which asks for transparent huge pages on
4 MB and more, as before) and torch's DataLoader at equal workers for scale. Prints a Markdown
table: wall seconds and the training process's system CPU seconds (page faults are most of
it), median (min-max) over the rounds.

``--epochs N`` runs one loader per row over N epochs instead (workers forked anew each epoch, as
without ``persistent_workers``) and reports the later epochs' mean wall seconds and the
training process's system CPU over all N: ``headrace`` (a buffer is kept from forked processes
only while it waits in the pool) against ``headrace, buffers never inherited`` (every buffer
kept from them from its allocation on, as before: a batch the user held was then unreadable
in a process the user forked).
"""

from __future__ import annotations

import argparse
import resource
import statistics
from collections.abc import Callable

import numpy as np

from headrace.bench.config import BenchConfig, LoaderSpec, full_config, standard_loaders
from headrace.bench.measure import run_epochs, run_once
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


EPOCH_ROWS = ("headrace", "headrace, buffers never inherited")

Row = Callable[[Workload, LoaderSpec, list[int], str, float, Options], tuple[float, float]]
"""One measurement of a row: (workload, its loader spec, order, row label, resource interval
s, options) -> (wall s, training-process system CPU s)."""


def _epochs(wl: Workload, spec: LoaderSpec, order: list[int], epochs: int, never: bool,
            interval_s: float, options: Options) -> tuple[float, float]:
    """(mean wall s of epochs 2..N, training-process system CPU s over all N) of one loader."""
    own = PageableMemory.allocate, PageableMemory.set_idle

    def never_inherited(self: PageableMemory, nbytes: int) -> np.ndarray:
        raw = own[0](self, nbytes)
        own[1](self, raw, True)  # kept from forks from the start, and never given back
        return raw

    if never:
        PageableMemory.allocate = never_inherited  # type: ignore[method-assign]
        PageableMemory.set_idle = lambda _self, _raw, _idle: None  # type: ignore[method-assign,assignment]
    try:
        s0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        recs = run_epochs(wl, spec, order, epochs, interval_s, options=options)
        later = [r.wall_s for r in recs[1:]] or [recs[0].wall_s]
        return statistics.mean(later), resource.getrusage(resource.RUSAGE_SELF).ru_stime - s0
    finally:
        PageableMemory.allocate, PageableMemory.set_idle = own  # type: ignore[method-assign]


def _interleaved(workloads: list[str], rounds: int, config: BenchConfig | None,
                 rows: tuple[str, ...], one: Row
                 ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{workload: {row: [one(...), ...]}}``: the rows round-robin over the rounds, each
    starting one row later; a ``headrace...`` row runs the ``headrace`` loader spec."""
    config = config or full_config(workloads)
    options = Options(profile_store=False, cache=None)
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for name in workloads:
        wl = build_workload(name, config)
        order = sampler_order(len(wl), config.seed)
        specs = {s.label: s for s in standard_loaders(wl.num_workers)}
        res: dict[str, list[tuple[float, float]]] = {k: [] for k in rows}
        for r in range(rounds):
            shift = r % len(rows)
            for label in rows[shift:] + rows[:shift]:
                spec = specs["headrace" if label.startswith("headrace") else label]
                res[label].append(one(wl, spec, order, label, config.resource_interval_s,
                                      options))
        out[name] = res
    return out


def later_epochs(workloads: list[str], rounds: int, epochs: int,
                 config: BenchConfig | None = None
                 ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{workload: {row: [(mean wall s of epochs 2..N, system CPU s), ...]}}`` (``--epochs``)."""
    return _interleaved(workloads, rounds, config, EPOCH_ROWS,
                        lambda wl, spec, order, label, interval_s, options: _epochs(
                            wl, spec, order, epochs, label == EPOCH_ROWS[1], interval_s, options))


def run(workloads: list[str], rounds: int, config: BenchConfig | None = None
        ) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{workload: {row: [(wall s, training-process system CPU s), ...]}}``; ``config``: the
    workloads' scale (default: the full bench's)."""
    return _interleaved(workloads, rounds, config, ROWS,
                        lambda wl, spec, order, label, interval_s, options: _epoch(
                            wl, spec, order, label == ROWS[1], interval_s, options))


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
    ap.add_argument("--epochs", type=int, default=0,
                    help="one loader per row over this many epochs (later epochs' wall)")
    a = ap.parse_args(argv)
    if a.epochs:
        emit(markdown(later_epochs(a.workloads, a.rounds, a.epochs)).replace(
            "| wall s |", f"| wall s (epochs 2-{a.epochs}, mean) |"))
        return
    emit(markdown(run(a.workloads, a.rounds)))


if __name__ == "__main__":
    main()
