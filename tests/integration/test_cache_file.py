"""The shared-memory cache's LMDB file at its limit (``cache/lmdb_store.py``), with processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

from headrace.cache import memory_backend
from headrace.cache.lmdb_store import LmdbStore

pytestmark = pytest.mark.integration

BUDGET = 4 << 20
OLD = b"D" * 16  # a live namespace, stored before the reader reads


def _read_and_hang(path: str, ready) -> None:
    """A worker inside ``get()``, killed there: its read slot holds a snapshot for good."""
    env, data, _ = LmdbStore(path, BUDGET)._dbs()
    txn = env.begin(db=data, buffers=True)
    txn.get(OLD + (0).to_bytes(8, "big"))
    ready.set()
    signal.pause()


def test_a_reader_killed_inside_a_read_does_not_make_the_store_raise() -> None:
    # every page freed after its snapshot stayed in use; at the file's limit the evictions
    # raised MapFullError from put() (1,140 of 1,200 puts in a review's repro) and from a
    # budget re-split at an epoch's start
    path = os.path.join(memory_backend.make_dir(), "s")
    store = LmdbStore(path, BUDGET)
    try:
        store.set_budgets({"decoded": BUDGET // 2, "augmented": BUDGET // 2})
        for i in range(8):
            store.put(OLD + i.to_bytes(8, "big"), "decoded", os.urandom(100_000), [OLD])
        ctx = mp.get_context("spawn")  # LMDB refuses an environment a fork inherited
        ready = ctx.Event()
        reader = ctx.Process(target=_read_and_hang, args=(path, ready), daemon=True)
        reader.start()
        assert ready.wait(60)
        os.kill(reader.pid, signal.SIGKILL)
        reader.join(60)
        results: dict[str, int] = {}
        for epoch in range(40):  # an augmented form keyed by epoch: each replaces the last
            ns = bytes([epoch + 1]) * 16
            for i in range(30):
                r = store.put(ns + i.to_bytes(8, "big"), "augmented", os.urandom(60_000),
                              [OLD, ns])
                results[r] = results.get(r, 0) + 1
        assert set(results) <= {"stored", "full"} and results["stored"] > 600, results
        store.set_budgets({"decoded": BUDGET // 8, "augmented": BUDGET // 2})
        assert store.mapped_bytes() <= BUDGET + (1 << 20)
    finally:
        memory_backend.remove_dir(os.path.dirname(path))
