"""Inserts a second into the memory cache, by writer processes and LMDB shards.

Each writer is a forked process storing ``--count`` decoded-image-sized entries (``--kb`` KB,
encoded with the cache's own codec) into one ``MemoryBackend`` with ``--shards`` environments,
as workers fill the cache in a first epoch. Rounds are interleaved (each configuration once per
round); reported: inserts a second, median and spread over the rounds, and the ratio to one
shard at the same number of writers:

    python -m headrace.bench.cache_writes --writers 1 2 8 --shards 1 2 8 --rounds 3

LMDB runs one write transaction at a time per environment, so with one shard the writers'
inserts queue behind one lock; with several, writers of different shards do not wait for each
other. On a machine with fewer cores than writers the CPU bounds both.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

import numpy as np

from headrace.cache import codec, memory_backend
from headrace.cache.memory_backend import MemoryBackend
from headrace.cache.tiers import sample_key

NS = b"W" * 16


def _write(backend: MemoryBackend, first: int, count: int, blob: bytes, out: mp.Queue) -> None:
    t0 = time.perf_counter()
    for i in range(first, first + count):
        r = backend.put(sample_key(NS, i), "decoded", blob, [NS])
        if r != "stored":
            raise RuntimeError(f"insert {i} was {r!r}: the budget is too small for the run")
    out.put(time.perf_counter() - t0)


def inserts_per_s(writers: int, shards: int, count: int, kb: int) -> float:
    """Inserts a second of ``writers`` processes storing ``count`` entries each (wall time
    from the first start to the last exit)."""
    blob = codec.encode(np.random.default_rng(0).integers(0, 255, kb * 1000, np.uint8))
    budget = 2 * writers * count * memory_backend.entry_cost(24, len(blob))
    path = memory_backend.make_dir()
    try:
        backend = MemoryBackend(path, budget, shards=shards)
        backend.set_budgets({"decoded": budget})
        backend.close_here()  # no environment open across the fork
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        procs = [ctx.Process(target=_write, args=(backend, w * count, count, blob, out))
                 for w in range(writers)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        wall = time.perf_counter() - t0
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError("a writer failed")
        stored = backend.usage()["decoded"] // memory_backend.entry_cost(24, len(blob))
        if stored != writers * count:
            raise RuntimeError(f"{stored} entries stored, {writers * count} written")
        return writers * count / wall
    finally:
        memory_backend.remove_dir(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writers", type=int, nargs="+", default=[1, 2, 8])
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 8])
    p.add_argument("--count", type=int, default=300, help="entries per writer")
    p.add_argument("--kb", type=int, default=800, help="entry size (KB)")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    runs: dict[tuple[int, int], list[float]] = {}
    for _ in range(a.rounds):
        for w in a.writers:
            for s in a.shards:
                runs.setdefault((w, s), []).append(inserts_per_s(w, s, a.count, a.kb))
    print(f"| writers | shards | inserts/s (median of {a.rounds}) | spread | vs 1 shard |")
    print("|---:|---:|---:|---:|---:|")
    for (w, s), xs in runs.items():
        base = statistics.median(runs[(w, 1)]) if (w, 1) in runs else float("nan")
        med = statistics.median(xs)
        print(f"| {w} | {s} | {med:,.0f} | {min(xs):,.0f}-{max(xs):,.0f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
