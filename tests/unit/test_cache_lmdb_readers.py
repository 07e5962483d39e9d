"""The LMDB store with reader threads whose snapshots pin the pages writes free
(``cache/lmdb_store.py``, "Readers that lag")."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

import numpy as np

from headrace.cache import memory_backend
from headrace.cache.lmdb_envs import PAGE
from headrace.cache.lmdb_store import LmdbStore

BUDGET = 1 << 20
NS = b"N" * 16


def _key(i: int) -> bytes:
    return NS + i.to_bytes(8, "big")


@contextlib.contextmanager
def _reader_inside() -> Iterator[tuple[LmdbStore, list[bytes], threading.Event,
                                      threading.Thread]]:
    """A store of 300 entries of 500 bytes and a reader thread inside ``get()`` of entry 0,
    its snapshot held until ``release`` is set; yields (store, entries, release, reader)."""
    path = os.path.join(memory_backend.make_dir(), "s")
    store = LmdbStore(path, BUDGET)
    inside, release = threading.Event(), threading.Event()

    def hold(buf: memoryview) -> bytes:  # a reader inside get(): its snapshot stays
        inside.set()
        release.wait(120)
        return bytes(buf)

    reader = threading.Thread(target=store.get, args=(_key(0), hold))
    try:
        store.set_budgets({"augmented": BUDGET})
        blobs = [os.urandom(500) for _ in range(300)]
        for i, blob in enumerate(blobs):
            assert store.put(_key(i), "augmented", blob, [NS]) == "stored"
        reader.start()
        assert inside.wait(60)
        yield store, blobs, release, reader
    finally:
        release.set()
        if reader.ident is not None:
            reader.join(60)
        memory_backend.remove_dir(os.path.dirname(path))


def test_a_write_with_no_pages_left_waits_for_the_reader_that_holds_them() -> None:
    # A reader thread inside get() holds its snapshot; every page freed after it stays in use
    # and LMDB takes new ones until the file is at its limit, with a few entries in it. take()
    # raised MDB_MAP_FULL there (4 threads, an 8 MiB store: 185-768 times in 5 s). Now it is a
    # miss while the reader stays, and once the reader can leave (here: as soon as the writer
    # lets go of the GIL), the take that found no pages is served after it left.
    switch = sys.getswitchinterval()
    with _reader_inside() as (store, blobs, release, reader):
        # takes free pages the reader's snapshot holds, until the file nears its limit
        i = 1
        while store.mapped_bytes() < store.map_size - 16 * PAGE:
            assert store.take(_key(i), "augmented", bytes) == blobs[i]
            i += 1

        def release_then_read(buf: memoryview) -> bytes:
            release.set()  # the reader runs once the writer lets go of the GIL
            return bytes(buf)

        # the reader, woken in release_then_read, gets the GIL only when the writer lets go
        # of it (no forced switch in between): when a take's delete finds no page, it waits
        # for the reader, which leaves, and is served
        sys.setswitchinterval(1.0)
        try:
            for j in range(i, i + 40):
                assert store.take(_key(j), "augmented", release_then_read) == blobs[j]
        finally:
            sys.setswitchinterval(switch)
        assert store.waits_given_up == 0
        reader.join(60)
        assert store.get(_key(i), bytes) is None  # taken: served once
        assert store.put(_key(i), "augmented", blobs[i], [NS]) == "stored"
        assert store.usage()["augmented"] == store.scan_bytes() <= BUDGET
        assert store.mapped_bytes() <= store.map_size


def test_a_reader_that_stays_is_waited_for_once_not_at_every_write() -> None:
    # A reader that never leaves (a stopped process's, one stuck in a decode) pins every page
    # freed after its snapshot. Every take that then found no pages waited READERS_WAIT_S
    # (0.25 s) for it under the write lock: a review's repro, 299 takes in 56 s, 225 of them
    # waiting. The snapshot waited for once is not waited for again: those takes are misses
    # at once (the entries kept), and only one write waits.
    with _reader_inside() as (store, blobs, release, reader):
        served = [store.take(_key(i), "augmented", bytes) for i in range(1, 300)]
        missed = [i for i, v in enumerate(served, 1) if v is None]
        assert len(missed) > 100  # the file is at its limit: most takes find no pages
        assert all(served[i - 1] == blobs[i] for i in range(1, 300) if i not in missed)
        assert store.waits_given_up == 1
        assert store.put(_key(1), "augmented", blobs[1], [NS]) == "full"
        assert store.waits_given_up == 1
        release.set()  # the reader leaves: its pages are reused, the kept entries served
        reader.join(60)
        assert store.take(_key(missed[0]), "augmented", bytes) == blobs[missed[0]]
        assert store.put(_key(1), "augmented", blobs[1], [NS]) == "stored"
        assert store.usage()["augmented"] == store.scan_bytes() <= BUDGET


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
