"""Shared memory the workers' rings hold: pages of each ring the training process has touched.

Each worker has a ring (``runtime/ring.py``: 256 MB of address space under fork, 16 MB
otherwise); what is resident of it is what the writer has written to at least once. Reads
``/proc/self/smaps`` (the rings are the training process's shared mappings of those sizes) after ``--batches`` batches of ``--sample-kb`` KB samples, a plain
``Dataset`` in batches of 8 (no cache):

    python -m headrace.bench.ring_memory --workers 2 32 --sample-kb 64 --batches 2000

``--large-mb 5 16`` instead times epochs of samples that large (10 batches, 2 workers, rounds
interleaved) against torch's loader: leaves over a quarter of a ring go through torch's shared
memory, one descriptor each.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 32])
    p.add_argument("--sample-kb", type=int, default=64)
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--large-mb", type=int, nargs="*", default=[],
                   help="also time epochs of samples this large against torch's loader")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
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
