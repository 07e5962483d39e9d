"""The LMDB store with reader threads whose snapshots pin the pages writes free
(``cache/lmdb_store.py``, "Readers that lag")."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

from headrace.cache import memory_backend
from headrace.cache.lmdb_envs import PAGE
from headrace.cache.lmdb_store import LmdbStore

BUDGET = 1 << 20
NS = b"N" * 16


def _key(i: int) -> bytes:
    return NS + i.to_bytes(8, "big")


def test_a_write_with_no_pages_left_waits_for_the_reader_that_holds_them() -> None:
    # A reader thread inside get() holds its snapshot; every page freed after it stays in use
    # and LMDB takes new ones until the file is at its limit, with a few entries in it. take()
    # raised MDB_MAP_FULL there (4 threads, an 8 MiB store: 185-768 times in 5 s). Now it is a
    # miss while the reader stays, and once the reader can leave (here: as soon as the writer
    # lets go of the GIL), the take that found no pages is served after it left.
    path = os.path.join(memory_backend.make_dir(), "s")
    store = LmdbStore(path, BUDGET)
    inside, release = threading.Event(), threading.Event()

    def hold(buf: memoryview) -> bytes:  # a reader inside get(): its snapshot stays
        inside.set()
        release.wait(60)
        return bytes(buf)

    reader = threading.Thread(target=store.get, args=(_key(0), hold))
    switch = sys.getswitchinterval()
    try:
        store.set_budgets({"augmented": BUDGET})
        blobs = [os.urandom(500) for _ in range(300)]
        for i, blob in enumerate(blobs):
            assert store.put(_key(i), "augmented", blob, [NS]) == "stored"
        reader.start()
        assert inside.wait(60)
        # takes free pages the reader's snapshot holds, until one finds none for its delete
        kept = next((i for i in range(1, len(blobs))
                     if store.take(_key(i), "augmented", bytes) is None), None)
        assert kept is not None and store.mapped_bytes() > store.map_size - 8 * PAGE

        def release_then_read(buf: memoryview) -> bytes:
            release.set()  # the reader runs once the writer lets go of the GIL
            return bytes(buf)

        # the reader, woken in release_then_read, gets the GIL only when the writer lets go
        # of it (no forced switch in between): the take's delete finds no page first
        sys.setswitchinterval(1.0)
        assert store.take(_key(0), "augmented", release_then_read) == blobs[0]
        sys.setswitchinterval(switch)
        reader.join(60)
        assert store.get(_key(0), bytes) is None  # taken: served once
        assert store.get(_key(kept), bytes) == blobs[kept]  # not served: kept
        assert store.put(_key(0), "augmented", blobs[0], [NS]) == "stored"
        assert store.usage()["augmented"] == store.scan_bytes() <= BUDGET
        assert store.mapped_bytes() <= store.map_size
    finally:
        sys.setswitchinterval(switch)
        release.set()
        reader.join(60)
        memory_backend.remove_dir(os.path.dirname(path))


def test_threads_putting_getting_and_taking_meet_no_lmdb_error() -> None:
    # The bug hunt's run, bounded: 4 threads on one store (executor="threads" shares the
    # training process's environment), each putting, getting and taking entries of 200-1,500
    # bytes. A reader thread that lost the GIL inside get() held its snapshot while another
    # thread committed hundreds of writes, and take() raised MDB_MAP_FULL.
    path = os.path.join(memory_backend.make_dir(), "s")
    store = LmdbStore(path, BUDGET)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(6000):
                key, op = _key(int(rng.integers(200))), int(rng.integers(4))
                if op < 2:
                    store.put(key, "augmented", os.urandom(int(rng.integers(200, 1500))), [NS])
                elif op == 2:
                    store.get(key, bytes)
                else:
                    store.take(key, "augmented", bytes)
        except Exception as e:  # noqa: BLE001 - the test's verdict
            errors.append(e)

    try:
        store.set_budgets({"augmented": BUDGET})
        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        assert store.usage()["augmented"] == store.scan_bytes() <= BUDGET
        assert store.mapped_bytes() <= store.map_size
    finally:
        memory_backend.remove_dir(os.path.dirname(path))
