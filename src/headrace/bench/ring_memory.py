"""Shared memory the workers' rings hold: pages of each ring the training process has touched.

Each worker has a ring (``runtime/ring.py``: 256 MB of address space under fork, 16 MB
otherwise); what is resident of it is what the writer has written to at least once. Reads
``/proc/self/smaps`` (the rings are the training process's shared mappings of those sizes) after ``--batches`` batches of ``--sample-kb`` KB samples, a plain
``Dataset`` in batches of 8 (no cache):

    python -m headrace.bench.ring_memory --workers 2 32 --sample-kb 64 --batches 2000

``--large-mb 5 16`` instead times epochs of samples that large (10 batches, 2 workers, rounds
interleaved) against torch's loader: leaves over a quarter of a ring go through torch's shared
memory, one descriptor each.

``--rss-mb 20`` instead measures memory against torch's loader, each run a fresh process
(:func:`process_memory`): ``--samples`` samples of that many MB, batches of 4, 2 persistent
workers, ``--epochs`` epochs, each batch read once as a training step would:

    python -m headrace.bench.ring_memory --rss-mb 20 --samples 200 --epochs 3 --rounds 3
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
import torch.utils.data as tud

from headrace.runtime.ring import FORK_RING_BYTES, RING_BYTES


class _Samples(tud.Dataset):
    def __init__(self, n: int, floats: int) -> None:
        self.n, self.floats = n, floats

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.floats,), float(i))


def ring_pages() -> tuple[int, int, int]:
    """(rings mapped in this process, MB of them resident, MB mapped)."""
    rings, kb, size, mapped = 0, 0, 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                size = hi - lo
            elif line.startswith("Rss:") and size in (RING_BYTES, FORK_RING_BYTES):
                rings += 1
                mapped += size
                kb += int(line.split()[1])
    return rings, kb >> 10, mapped >> 20


def measure(workers: int, sample_kb: int, batches: int) -> dict[str, Any]:
    """This loader's rings after ``batches`` batches: how many, MB resident and MB mapped
    (what other loaders of the process still map is not counted)."""
    from headrace.runtime import DataLoader

    before = ring_pages()
    loader: Any = DataLoader(_Samples(8 * batches + 8, sample_kb * 256), batch_size=8,
                             num_workers=workers, shuffle=True, timeout=120)
    try:
        for k, _ in enumerate(loader):
            if k + 1 == batches:
                rings, mb, mapped = (a - b for a, b in zip(ring_pages(), before, strict=True))
                return {"workers": workers, "rings": rings, "resident_mb": mb,
                        "mapped_mb": mapped}
    finally:
        loader.close()
    raise RuntimeError("the epoch ended early")


def large_epoch_s(kind: str, sample_mb: int, batch: int, batches: int) -> float:
    """Seconds of one epoch of ``batches`` batches of ``sample_mb`` MB float32 samples, 2
    workers, torch's default collate: ``kind`` ``"headrace"`` or ``"torch"`` (fresh loader)."""
    import time

    from headrace.runtime import DataLoader

    ds = _Samples(batch * batches, sample_mb * (1 << 18))
    cls: Any = DataLoader if kind == "headrace" else tud.DataLoader
    loader = cls(ds, batch_size=batch, num_workers=2, timeout=300)
    t0 = time.perf_counter()
    n = sum(len(b) for b in loader)
    wall = time.perf_counter() - t0
    getattr(loader, "close", lambda: None)()
    if n != batch * batches:
        raise RuntimeError(f"{n} samples delivered, expected {batch * batches}")
    return wall


def _rollup(pid: int) -> dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` in bytes, plus ``RssShmem`` from its status (empty: gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                p = line.split()
                if len(p) == 3 and p[2] == "kB":
                    out[p[0].rstrip(":")] = int(p[1]) << 10
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssShmem:"):
                    out["RssShmem"] = int(line.split()[1]) << 10
    except OSError:  # a worker that exited meanwhile
        pass
    return out


def tree_memory() -> dict[str, int]:
    """Bytes: this process's ``rss`` and ``shmem`` (the shared memory counted in it), and its
    process tree's ``pss`` (each page divided among the processes mapping it: shared pages
    counted once in all) and ``uss`` (pages one process alone maps)."""
    import psutil

    me = _rollup(os.getpid())
    out = {"rss": me.get("Rss", 0), "shmem": me.get("RssShmem", 0), "pss": 0, "uss": 0}
    for r in [me] + [_rollup(c.pid) for c in psutil.Process().children(recursive=True)]:
        out["pss"] += r.get("Pss", 0)
        out["uss"] += r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
    return out


def process_memory(kind: str, sample_mb: float, samples: int, epochs: int) -> dict[str, int]:
    """MB of memory over ``epochs`` epochs of ``samples`` float32 samples of ``sample_mb`` MB
    (batches of 4, 2 persistent workers, shuffled; each batch summed once): ``peak_rss`` (this
    process, read every 20 ms), then with the workers still alive after the last epoch
    ``rss``, ``shmem``, and the process tree's ``pss`` and ``uss`` (:func:`tree_memory`).
    ``kind``: ``"headrace"`` or ``"torch"``. Meant for a fresh process: a process's peak
    stays."""
    import threading

    from headrace.runtime import DataLoader

    cls: Any = DataLoader if kind == "headrace" else tud.DataLoader
    loader = cls(_Samples(samples, int(sample_mb * (1 << 18))), batch_size=4, num_workers=2,
                 persistent_workers=True, shuffle=True, timeout=300)
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], tree_memory()["rss"])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for _ in range(epochs):
            for b in loader:
                float(b.sum())
                del b  # not held while the next is made, nor at the end
        stop.set()
        watcher.join()
        end = tree_memory()
    finally:
        stop.set()
        getattr(loader, "close", lambda: None)()
    return {k: v >> 20 for k, v in {"peak_rss": max(peak[0], end["rss"]), **end}.items()}


def _memory_table(sample_mb: float, samples: int, epochs: int, rounds: int) -> None:
    """Runs :func:`process_memory` in fresh processes, the loaders interleaved, and prints
    medians (min-max) over ``rounds``."""
    import json
    import statistics
    import subprocess
    import sys

    runs: dict[str, list[dict[str, int]]] = {"headrace": [], "torch": []}
    for k in range(rounds):
        for kind in (("headrace", "torch") if k % 2 == 0 else ("torch", "headrace")):
            out = subprocess.run(
                [sys.executable, "-m", "headrace.bench.ring_memory", "--one", kind,
                 "--rss-mb", str(sample_mb), "--samples", str(samples), "--epochs", str(epochs)],
                check=True, capture_output=True, text=True).stdout
            runs[kind].append(json.loads(out.strip().splitlines()[-1]))
    keys = ("peak_rss", "rss", "shmem", "pss", "uss")
    print(f"| loader | training process: peak RSS | RSS after | shared in it | tree PSS after "
          f"| tree USS after |  MB, {samples} samples of {sample_mb:g} MB, {epochs} epochs")
    print("|---|---|---|---|---|---|")
    for kind, rs in runs.items():
        cells = [f"{statistics.median(r[k] for r in rs):g} ({min(r[k] for r in rs)}-"
                 f"{max(r[k] for r in rs)})" for k in keys]
        print(f"| {kind} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 32])
    p.add_argument("--sample-kb", type=int, default=64)
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--large-mb", type=int, nargs="*", default=[],
                   help="also time epochs of samples this large against torch's loader")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rss-mb", type=float, default=None,
                   help="measure memory with samples this large against torch's loader")
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--one", choices=("headrace", "torch"), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:  # one run of --rss-mb, in the fresh process _memory_table started
        import json

        print(json.dumps(process_memory(args.one, args.rss_mb, args.samples, args.epochs)))
        return
    if args.rss_mb:
        _memory_table(args.rss_mb, args.samples, args.epochs, args.rounds)
        return
    if args.large_mb:
        import statistics

        print("| sample | batch | headrace s | torch s | torch ÷ headrace |")
        print("|---|---|---|---|---|")
        for mb in args.large_mb:
            batch = max(4, 256 // mb)
            times: dict[str, list[float]] = {"headrace": [], "torch": []}
            for k in range(args.rounds):  # interleaved
                for kind in (("headrace", "torch") if k % 2 == 0 else ("torch", "headrace")):
                    times[kind].append(large_epoch_s(kind, mb, batch, 10))
            h, t = statistics.median(times["headrace"]), statistics.median(times["torch"])
            print(f"| {mb} MB | {batch} | {h:.2f} ({min(times['headrace']):.2f}-"
                  f"{max(times['headrace']):.2f}) | {t:.2f} ({min(times['torch']):.2f}-"
                  f"{max(times['torch']):.2f}) | {t / h:.2f}x |")
        return
    print(f"| workers | rings | resident (MB) | mapped (MB) |  {args.sample_kb} KB samples, "
          f"after {args.batches} batches of 8")
    print("|---|---|---|---|")
    for w in args.workers:
        r = measure(w, args.sample_kb, args.batches)
        print(f"| {w} | {r['rings']} | {r['resident_mb']} | {r['mapped_mb']} |")


if __name__ == "__main__":
    main()
