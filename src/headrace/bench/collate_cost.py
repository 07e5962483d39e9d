"""An expensive user ``collate_fn``: torch's DataLoader vs headrace at equal workers.

torch runs ``collate_fn`` in the worker that loaded the batch, so N workers collate N batches at
once. headrace forms batches in the training process (a worker does not know which samples will
share a batch) and runs a user ``collate_fn`` there, on its collate thread when a batch is
complete: one batch at a time by default (``Options(collate_threads=1)``: calls never overlap,
as in each of torch's workers), several with ``collate_threads=4`` (the last row). This script
measures what that costs: one epoch per loader, the loaders interleaved round by round (the
machine may be shared, so read the ratios, not the absolute times).

Costs are simulated: ``--work sleep`` (default) sleeps, which isolates the scheduling effect
from CPU contention; ``--work cpu`` spins (a collate_fn in pure Python that holds the GIL, e.g.
padding and tokenising), which also competes with the training loop and the scheduler.

    python -m headrace.bench.collate_cost --workers 4 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data as tud


def _spend(seconds: float, work: str) -> None:
    """Spend ``seconds`` of wall time, sleeping or spinning on the CPU."""
    if work == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class CostlySamples(tud.Dataset):
    """``n`` samples of ``(64,)`` float32, each costing ``sample_s`` seconds."""

    def __init__(self, n: int, sample_s: float, work: str) -> None:
        self.n, self.sample_s, self.work = n, sample_s, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        _spend(self.sample_s, self.work)
        return torch.full((64,), float(i))


class CostlyCollate:
    """A ``collate_fn`` costing ``seconds`` per batch, then torch's ``default_collate``."""

    def __init__(self, seconds: float, work: str) -> None:
        self.seconds, self.work = seconds, work

    def __call__(self, batch: list[Any]) -> Any:
        _spend(self.seconds, self.work)
        return tud.default_collate(batch)


def _epoch_s(make: Callable[[], Any]) -> tuple[float, int]:
    """Seconds for one whole epoch of a freshly built loader (worker start-up included, as a
    user's first epoch has it), and the number of samples it delivered."""
    loader = make()
    t0 = time.perf_counter()
    n = sum(len(b) for b in loader)
    dt = time.perf_counter() - t0
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    return dt, n


def run(workers: int, rounds: int, samples: int, batch: int, sample_ms: float,
        collate_ms: float, work: str) -> dict[str, list[float]]:
    """Epoch seconds per loader and round (loaders interleaved within each round)."""
    import headrace as hr

    ds = CostlySamples(samples, sample_ms / 1000, work)
    collate = CostlyCollate(collate_ms / 1000, work)
    kw: dict[str, Any] = {"batch_size": batch, "num_workers": workers, "collate_fn": collate,
                          "shuffle": True}
    makers: dict[str, Callable[[], Any]] = {
        "torch": lambda: tud.DataLoader(ds, **kw),
        "headrace in_order=True": lambda: hr.DataLoader(ds, in_order=True, **kw),
        "headrace default": lambda: hr.DataLoader(ds, **kw),
        "headrace 4 collate threads": lambda: hr.DataLoader(
            ds, options=hr.Options(collate_threads=4), **kw),
    }
    times: dict[str, list[float]] = {k: [] for k in makers}
    for _ in range(rounds):
        for name, make in makers.items():
            dt, n = _epoch_s(make)
            assert n == samples, f"{name} delivered {n} of {samples} samples"
            times[name].append(dt)
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--sample-ms", type=float, default=2.0, help="cost of one sample (ms)")
    p.add_argument("--collate-ms", type=float, default=20.0, help="cost of collate_fn (ms/batch)")
    p.add_argument("--work", choices=("sleep", "cpu"), default="sleep")
    a = p.parse_args(argv)
    times = run(a.workers, a.rounds, a.samples, a.batch, a.sample_ms, a.collate_ms, a.work)
    batches = -(-a.samples // a.batch)
    ideal_torch = batches * (a.batch * a.sample_ms + a.collate_ms) / a.workers / 1000
    serial_collate = batches * a.collate_ms / 1000
    print(f"{a.samples} samples x {a.sample_ms} ms, batch {a.batch}, collate_fn {a.collate_ms} "
          f"ms/batch ({a.work}), {a.workers} workers, {a.rounds} interleaved rounds")
    print(f"  bound if collate runs in the workers: {ideal_torch:.2f} s; "
          f"collate_fn alone, one batch at a time: {serial_collate:.2f} s")
    ref = statistics.median(times["torch"])
    for name, ts in times.items():
        med = statistics.median(ts)
        ratios = [t / r for t, r in zip(ts, times["torch"], strict=True)]
        print(f"  {name:26s} median {med:6.2f} s  x torch: median {statistics.median(ratios):.2f} "
              f"(per round {', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"  (torch median {ref:.2f} s)")


if __name__ == "__main__":
    main()
