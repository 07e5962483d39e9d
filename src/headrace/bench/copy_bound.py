"""What writing samples straight into the batch could gain at most (issue 13, item 3).

With worker processes a finished sample is copied twice: by its worker into the worker's ring,
and by the scheduler thread out of the ring into its row of the batch
(``runtime/assembly.py``: ``BatchAssembly._store``, memory-bound, about 11 ms of the training
process's CPU per 64-image imagenet batch). A worker that wrote its sample straight into the
batch's shared memory would save the second copy and keep the first.

This measures the most that change could gain, without building it: a row whose copy is skipped
outright. The ``no batch copy`` loader is headrace with ``BatchAssembly._store`` copying
nothing into the batch's arrays (non-array leaves, e.g. the ``index``, are kept, so every
epoch is still checked exactly once); its batches hold whatever the reused buffers held, so it
is a bound, never a loader to train with. If even that does not measure faster than the copy,
the change does not pay on this machine.

Per round, one loader of each kind runs ``--epochs`` epochs (workers kept between epochs:
``persistent_workers=True`` for torch, as headrace keeps its own); the first epoch of each is
discarded (start-up), the rest are reported as median (min-max) over rounds, the loaders
interleaved round by round. headrace runs without the sample cache (``Options(cache=None)``),
so every epoch decodes every image.

    python -m headrace.bench.copy_bound --rounds 3 --epochs 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

LOADERS = ("headrace", "no batch copy", "torch")


@contextmanager
def _no_batch_copy() -> Iterator[None]:
    """``BatchAssembly._store`` keeps rows' non-array leaves and copies no array into the batch."""
    from headrace.runtime import assembly

    original = assembly.BatchAssembly._store

    def store(self: Any, row: int, leaves: list[Any]) -> None:
        for dst, objects, leaf in zip(self._rows, self._objects, leaves, strict=True):
            if dst is None:
                objects[row] = leaf
        self._stored.append(row)

    assembly.BatchAssembly._store = store  # type: ignore[method-assign]
    try:
        yield
    finally:
        assembly.BatchAssembly._store = original  # type: ignore[method-assign]


def _epochs(kind: str, workload: Any, workers: int, epochs: int) -> list[float]:
    """Wall seconds of each epoch of one loader, checked exactly once."""
    from headrace import Options
    from headrace.bench.config import LoaderSpec
    from headrace.bench.measure import make_loader

    order = list(range(len(workload)))
    spec = LoaderSpec(label=kind, kind="torch" if kind == "torch" else "headrace",
                      num_workers=workers, in_order=False, persistent_workers=True)
    options = None if kind == "torch" else Options(cache=None, profile_store=False)
    loader = make_loader(workload, spec, order, options)
    walls = []
    try:
        for epoch in range(epochs):
            seen: list[int] = []
            t0 = time.perf_counter()
            for batch in loader:
                seen.extend(batch["index"].tolist())
                time.sleep(workload.accelerator_step_s)  # the simulated accelerator step
            walls.append(time.perf_counter() - t0)
            if sorted(seen) != order:
                raise AssertionError(f"{kind}, epoch {epoch}: samples lost or repeated")
    finally:
        if kind != "torch":
            loader.close()
    return walls


def main(argv: list[str] | None = None) -> None:
    from headrace.runtime.native_threads import blas_limited
    from headrace.workloads.registry import get_workload

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="imagenet")
    ap.add_argument("--scale", type=float, default=1.0, help="factor on the workload's samples")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3, help="per loader; the first is discarded")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.epochs < 2:
        ap.error("--rounds must be >= 1 and --epochs >= 2 (the first epoch is discarded)")
    torch.set_num_threads(1)
    workload = get_workload(args.workload, scale=args.scale)
    walls: dict[str, list[float]] = {k: [] for k in LOADERS}
    with blas_limited(1):
        for r in range(args.rounds):
            for kind in LOADERS:
                if kind == "no batch copy":
                    with _no_batch_copy():
                        w = _epochs(kind, workload, args.workers, args.epochs)
                else:
                    w = _epochs(kind, workload, args.workers, args.epochs)
                walls[kind].extend(w[1:])
                print(f"round {r + 1} {kind:<14} " + " ".join(f"{x:.2f}" for x in w), flush=True)
    print(f"\n{args.workload}: {len(workload)} samples, {args.workers} workers, epochs 2-"
          f"{args.epochs} of {args.rounds} rounds (wall s, median (min-max))\n")
    print("| loader | wall s | ÷ headrace |\n|---|---|---|")
    base = statistics.median(walls["headrace"])
    for kind in LOADERS:
        w = walls[kind]
        med = statistics.median(w)
        print(f"| {kind} | {med:.2f} ({min(w):.2f}–{max(w):.2f}) | {med / base:.3f} |")


if __name__ == "__main__":
    main()
