"""The LMDB memory backend: budget by measurement, eviction of stale namespaces only."""

from __future__ import annotations

import os

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
