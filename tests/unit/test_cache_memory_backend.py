"""The LMDB memory backend: budget by measurement, eviction of stale namespaces only."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import pytest

from headrace.cache import codec, memory_backend
from headrace.cache.memory_backend import MemoryBackend, entry_cost
from headrace.cache.tiers import sample_key

NS_A, NS_B = b"A" * 16, b"B" * 16


@pytest.fixture
def backend():
    path = memory_backend.make_dir()
    b = MemoryBackend(path, 2_000_000)
    yield b
    memory_backend.remove_dir(path)
    assert not os.path.exists(path)


def _blob(i: int, size: int) -> bytes:
    return codec.encode(np.full(size, i % 251, dtype=np.uint8))


@pytest.mark.parametrize("size", [100, 5000, 70_000])
def test_budget_is_never_exceeded_measured(backend, size) -> None:
    budget = 1_000_000
    backend.set_budgets({"decoded": budget})
    results = [backend.put(sample_key(NS_A, i), "decoded", _blob(i, size), [NS_A])
               for i in range(4 * budget // size)]
    assert "stored" in results and results[-1] == "full"
    measured = backend.scan_bytes()
    assert measured == backend.usage()["decoded"] <= budget
    assert measured > budget - entry_cost(24, len(_blob(0, size)))  # filled up to the last one
    # the LMDB file itself: the budget plus its own pages (B-tree, meta, free list)
    assert backend.mapped_bytes() <= budget * 1.15 + 64 * 4096


def test_hits_are_what_was_stored(backend) -> None:
    backend.set_budgets({"encoded": 10**6})
    backend.put(sample_key(NS_A, 7), "encoded", codec.encode({"x": np.arange(3)}), [NS_A])
    got = backend.get(sample_key(NS_A, 7), codec.decode)
    np.testing.assert_array_equal(got["x"], np.arange(3))
    assert backend.get(sample_key(NS_A, 8), codec.decode) is None
    assert backend.put(sample_key(NS_A, 7), "encoded", b"other", [NS_A]) == "exists"


def test_stale_namespaces_are_evicted_live_ones_never(backend) -> None:
    blob = _blob(0, 10_000)
    cost = entry_cost(24, len(blob))
    backend.set_budgets({"augmented": 10 * cost})
    for i in range(10):
        assert backend.put(sample_key(NS_A, i), "augmented", blob, [NS_A]) == "stored"
    assert backend.put(sample_key(NS_B, 0), "augmented", blob, [NS_A, NS_B]) == "full"
    # NS_A is no longer live (an earlier epoch): its entries make room, one by one
    for i in range(10):
        assert backend.put(sample_key(NS_B, i), "augmented", blob, [NS_B]) == "stored"
    assert backend.get(sample_key(NS_A, 9), codec.decode) is None
    assert backend.scan_bytes() == backend.usage()["augmented"] == 10 * cost


def test_take_serves_once(backend) -> None:
    backend.set_budgets({"augmented": 10**6})
    backend.put(sample_key(NS_A, 1), "augmented", codec.encode(5), [NS_A])
    assert backend.take(sample_key(NS_A, 1), "augmented", codec.decode) == 5
    assert backend.take(sample_key(NS_A, 1), "augmented", codec.decode) is None
    assert backend.usage()["augmented"] == 0 == backend.scan_bytes()


def test_a_smaller_share_drops_entries_until_it_fits(backend) -> None:
    blob = _blob(0, 10_000)
    cost = entry_cost(24, len(blob))
    backend.set_budgets({"decoded": 10 * cost, "encoded": 0})
    for i in range(10):
        backend.put(sample_key(NS_A, i), "decoded", blob, [NS_A])
    backend.set_budgets({"decoded": 4 * cost, "encoded": 6 * cost})
    assert backend.usage()["decoded"] == 4 * cost == backend.scan_bytes()
    assert backend.budget("encoded") == 6 * cost


def _file_bytes(backend: MemoryBackend) -> int:
    """Memory the shards' LMDB files hold on tmpfs (allocated blocks, bytes)."""
    return sum(os.stat(os.path.join(s.path, "data.mdb")).st_blocks * 512 for s in backend.shards)


def _file_limit(budget: int) -> int:
    """The documented limit (docs/design.md): the budget plus 1/16 of it, at least 1 MiB."""
    return budget + max(budget // 16, 1 << 20)


@contextlib.contextmanager
def _one_shard(budget: int, tier: str) -> Iterator[MemoryBackend]:
    """A one-shard backend whose whole ``budget`` is ``tier``'s, removed after."""
    path = memory_backend.make_dir()
    try:
        backend = MemoryBackend(path, budget, shards=1)
        backend.set_budgets({tier: budget})
        yield backend
    finally:
        memory_backend.remove_dir(path)


def test_file_stays_within_the_budget_when_each_epoch_replaces_the_last() -> None:
    # Entries of 100 KB-1.5 MB in a tier whose namespace changes every epoch (an augmented
    # form keyed by epoch): each epoch evicts the last one's entries. LMDB reuses a freed run
    # of pages only two transactions later and only for an entry that fits in it, so the file
    # reached 1.4x the budget in the second epoch while the entries stayed within it.
    budget = 8 << 20
    with _one_shard(budget, "augmented") as backend:
        rng = np.random.default_rng(0)
        for epoch in range(8):
            ns = bytes([epoch]) * 16
            stored = 0
            for i in rng.permutation(40):
                blob = _blob(int(i), int(rng.integers(100_000, 1_500_000)))
                if backend.put(sample_key(ns, int(i)), "augmented", blob, [ns]) == "stored":
                    stored += entry_cost(24, len(blob))
            assert backend.mapped_bytes() <= _file_limit(budget), epoch
            assert _file_bytes(backend) <= _file_limit(budget), epoch
            # and each epoch's entries still fill the budget (up to one large entry)
            assert stored > budget - (3 << 19), epoch
            assert backend.usage()["augmented"] == backend.scan_bytes() <= budget


def test_small_entries_stored_in_random_order_stay_within_the_budget() -> None:
    # Entries under a page share LMDB's leaf pages, which random keys leave 60-70% full: the
    # file held 1.7x what the entries count. Its pages, not only the entries', are budgeted.
    budget = 4 << 20
    with _one_shard(budget, "encoded") as backend:
        rng = np.random.default_rng(1)
        for i in rng.permutation(8000):
            backend.put(sample_key(NS_A, int(i)), "encoded",
                        _blob(int(i), int(rng.integers(200, 1500))), [NS_A])
        assert _file_bytes(backend) <= backend.mapped_bytes() <= _file_limit(budget)
        assert backend.scan_bytes() > budget // 2  # what the file's pages hold, minus B-tree
        # at its limit the file still has the pages a delete copies on write (its reserve)
        taken = [backend.take(sample_key(NS_A, i), "encoded", codec.decode) for i in range(99)]
        assert any(v is not None for v in taken)
        backend.set_budgets({"encoded": 0})
        assert backend.scan_bytes() == 0


def _start_ticks(pid: int) -> int:
    """``pid``'s start time as ``/proc/<pid>/stat`` gives it (clock ticks since boot)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2:].split()[19])


def test_a_directory_of_a_reused_pid_is_removed_one_of_its_live_owner_kept(tmp_path,
                                                                            monkeypatch) -> None:
    # a container restarted with /dev/shm kept gives its new training process the killed one's
    # pid: the sweep asked only whether the pid existed, and kept every killed job's directory
    # (384 MB, 767 MB, 1.2 GB after three restarts)
    monkeypatch.setattr(memory_backend, "SHM_ROOT", str(tmp_path))
    me, start = os.getpid(), _start_ticks(os.getpid())
    reused = tmp_path / f"headrace-cache-{me}-{start - 1}-a1b2c3d4"  # an earlier process's
    live = tmp_path / f"headrace-cache-{me}-{start}-e5f6g7h8"  # this one's, lock not made yet
    older = tmp_path / f"headrace-cache-{me}-i9j0k1l2"  # an older version's: the pid decides
    for d in (reused, live, older):
        d.mkdir()
        (d / "shard-0").mkdir()
    path = memory_backend.make_dir()
    try:
        assert not reused.exists() and live.exists() and older.exists()
    finally:
        memory_backend.remove_dir(path)


def test_the_owners_lock_decides_whatever_pid_the_name_holds(tmp_path, monkeypatch) -> None:
    # another container sharing /dev/shm: its pids mean nothing here, its lock does
    import fcntl

    monkeypatch.setattr(memory_backend, "SHM_ROOT", str(tmp_path))
    absent_pid = 1 << 22  # above any pid_max
    held = tmp_path / f"headrace-cache-{absent_pid}-5-a1b2c3d4"
    free = tmp_path / f"headrace-cache-{os.getpid()}-{_start_ticks(os.getpid())}-e5f6g7h8"
    for d in (held, free):
        d.mkdir()
        (d / "owner.lock").touch()
        (d / "shard-0").mkdir()
    fd = os.open(held / "owner.lock", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # its owner lives
        path = memory_backend.make_dir()
        memory_backend.remove_dir(path)
        assert held.exists() and not free.exists()  # free: every process of its owner is gone
    finally:
        os.close(fd)
