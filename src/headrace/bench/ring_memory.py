"""Shared memory the workers' rings hold: pages of each ring the training process has touched.

Each worker has a 16 MB ring (``runtime/ring.py``); what is resident of it is what the writer
has written to at least once. Reads ``/proc/self/smaps`` (the rings are the training process's
16 MB shared mappings) after ``--batches`` batches of ``--sample-kb`` KB samples, a plain
``Dataset`` in batches of 8 (no cache):

    python -m headrace.bench.ring_memory --workers 2 32 --sample-kb 64 --batches 2000
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.utils.data as tud

from headrace.runtime.ring import RING_BYTES


class _Samples(tud.Dataset):
    def __init__(self, n: int, floats: int) -> None:
        self.n, self.floats = n, floats

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((self.floats,), float(i))


def ring_pages() -> tuple[int, int]:
    """(rings mapped in this process, MB of them resident)."""
    rings, kb, size = 0, 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                size = hi - lo
            elif line.startswith("Rss:") and size == RING_BYTES:
                rings += 1
                kb += int(line.split()[1])
    return rings, kb >> 10


def measure(workers: int, sample_kb: int, batches: int) -> dict[str, Any]:
    from headrace.runtime import DataLoader

    loader: Any = DataLoader(_Samples(8 * batches + 8, sample_kb * 256), batch_size=8,
                             num_workers=workers, shuffle=True, timeout=120)
    try:
        for k, _ in enumerate(loader):
            if k + 1 == batches:
                rings, mb = ring_pages()
                return {"workers": workers, "rings": rings, "resident_mb": mb,
                        "mapped_mb": rings * RING_BYTES >> 20}
    finally:
        loader.close()
    raise RuntimeError("the epoch ended early")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 32])
    p.add_argument("--sample-kb", type=int, default=64)
    p.add_argument("--batches", type=int, default=2000)
    args = p.parse_args(argv)
    print(f"| workers | rings | resident (MB) | mapped (MB) |  {args.sample_kb} KB samples, "
          f"after {args.batches} batches of 8")
    print("|---|---|---|---|")
    for w in args.workers:
        r = measure(w, args.sample_kb, args.batches)
        print(f"| {w} | {r['rings']} | {r['resident_mb']} | {r['mapped_mb']} |")


if __name__ == "__main__":
    main()
