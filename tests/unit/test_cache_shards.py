"""The memory backend split into LMDB shards: every entry found where it was put, budgets held
per tier across shards, and "full" said only once every shard is."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import numpy as np
import pytest
import torch

from headrace.cache import codec, memory_backend
from headrace.cache.client import CacheClient, Counters
from headrace.cache.memory_backend import (
    CORES_PER_SHARD,
    MAX_SHARDS,
    MIN_SHARD_BYTES,
    MemoryBackend,
    entry_cost,
    shard_count,
    split_budget,
    split_tiers,
)
from headrace.cache.tiers import Tier, TierLayout, sample_key

NS_A, NS_B = b"A" * 16, b"B" * 16
SHARDS = 4


@pytest.fixture
def backend():
    path = memory_backend.make_dir()
    b = MemoryBackend(path, 4_000_000, shards=SHARDS)
    yield b
    memory_backend.remove_dir(path)
    assert not os.path.exists(path)


def _blob(i: int, size: int = 10_000) -> bytes:
    return codec.encode(np.full(size, i % 251, dtype=np.uint8))


def test_shard_count_follows_cores_and_budget() -> None:
    assert shard_count(64 << 30, 2) == shard_count(64 << 30, 7) == 1
    assert shard_count(64 << 30, 8) == 8 // CORES_PER_SHARD == 2
    assert shard_count(64 << 30, 128) == MAX_SHARDS
    assert shard_count(3 * MIN_SHARD_BYTES, 64) == 3  # each shard holds enough entries
    assert shard_count(1 << 20, 64) == 1


@pytest.mark.parametrize("budget,shards", [(10, 3), (7, 7), (0, 2), (10**9 + 1, 16)])
def test_split_budget_sums_to_the_budget(budget, shards) -> None:
    parts = split_budget(budget, shards)
    assert len(parts) == shards and sum(parts) == budget and max(parts) - min(parts) <= 1


def test_tier_shares_fit_every_shard_and_sum_to_each_tier() -> None:
    """1,000 bytes in 3 shards and tiers of 500 + 500: shard 0 holds 334, so the tiers' parts
    there may not be 167 + 167; over random splits too, every shard's parts fit its share."""
    assert [sum(p.values()) for p in split_tiers({"encoded": 500, "decoded": 500}, 3)] \
        == split_budget(1000, 3)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        shards = int(rng.integers(1, 17))
        total = int(rng.integers(0, 10**7))
        cuts = np.sort(rng.integers(0, total + 1, int(rng.integers(0, 3))))
        sizes = np.diff(np.concatenate([[0], cuts, [total]])).tolist()
        if rng.random() < 0.5:
            sizes[-1] -= int(rng.integers(0, sizes[-1] + 1))  # tiers may leave some unused
        budgets = dict(zip(["augmented", "decoded", "encoded"], sizes, strict=False))  # 1-3 tiers
        parts = split_tiers(budgets, shards)
        for tier, b in budgets.items():
            assert sum(p[tier] for p in parts) == b
            assert max(p[tier] for p in parts) - min(p[tier] for p in parts) <= 1
        for p, share in zip(parts, split_budget(total, shards), strict=True):
            assert sum(p.values()) <= share


def test_two_tiers_split_over_shards_are_applied(backend) -> None:
    backend.set_budgets({"encoded": 2_000_001, "decoded": 1_999_999})  # all of 4_000_000
    assert backend.budget("encoded") == 2_000_001 and backend.budget("decoded") == 1_999_999
    for store, share in zip(backend.shards, split_budget(4_000_000, SHARDS), strict=True):
        assert store.budget("encoded") + store.budget("decoded") <= share


def test_entries_spread_over_shards_and_are_found(backend) -> None:
    backend.set_budgets({"decoded": 4_000_000})
    for i in range(40):
        assert backend.put(sample_key(NS_A, i), "decoded", _blob(i, 100), [NS_A]) == "stored"
    held = [len(list(_keys(s))) for s in backend.shards]
    assert sum(held) == 40 and min(held) > 0  # every shard got some
    for i in range(40):
        np.testing.assert_array_equal(backend.get(sample_key(NS_A, i), codec.decode),
                                      np.full(100, i, np.uint8))
    assert backend.put(sample_key(NS_A, 3), "decoded", _blob(3, 100), [NS_A]) == "exists"
    assert backend.get(sample_key(NS_B, 3), codec.decode) is None


def _keys(store):
    env, data, _ = store._dbs()
    with env.begin(db=data) as txn:
        return [bytes(k) for k, _ in txn.cursor()]


def test_full_only_once_every_shard_is_and_the_budget_holds(backend) -> None:
    blob = _blob(0)
    cost = entry_cost(24, len(blob))
    budget = 40 * cost
    backend.set_budgets({"decoded": budget})
    results = [backend.put(sample_key(NS_A, i), "decoded", blob, [NS_A]) for i in range(200)]
    assert "shard_full" in results  # a shard filled while others had room...
    first_full = results.index("full")
    assert set(results[first_full:]) == {"full"}  # ...and "full" stays once all are
    assert results[:first_full].count("stored") == results.count("stored")
    measured = backend.scan_bytes()
    assert measured == sum(backend.usage().values()) <= budget
    assert backend.budget("decoded") == budget
    # each shard filled to within one entry of its share: nothing left unused but crumbs
    assert measured > budget - SHARDS * cost


def test_new_live_namespaces_evict_stale_ones_in_every_shard(backend) -> None:
    blob = _blob(0)
    cost = entry_cost(24, len(blob))
    backend.set_budgets({"augmented": 20 * cost})
    stored_a = [i for i in range(100)
                if backend.put(sample_key(NS_A, i), "augmented", blob, [NS_A]) == "stored"]
    assert backend.put(sample_key(NS_B, 0), "augmented", blob, [NS_A, NS_B]) in ("full",
                                                                                   "shard_full")
    stored_b = [i for i in range(100)  # NS_A no longer live: its entries make room
                if backend.put(sample_key(NS_B, i), "augmented", blob, [NS_B]) == "stored"]
    assert len(stored_b) >= len(stored_a) - SHARDS
    assert all(backend.get(sample_key(NS_A, i), codec.decode) is None for i in stored_a)
    assert backend.scan_bytes() == backend.usage()["augmented"] <= 20 * cost


def test_take_serves_once_and_makes_room_again(backend) -> None:
    blob = _blob(0)
    cost = entry_cost(24, len(blob))
    backend.set_budgets({"augmented": 8 * cost})
    results = {i: backend.put(sample_key(NS_A, i), "augmented", blob, [NS_A]) for i in range(60)}
    assert results[59] == "full"
    taken = next(i for i, r in results.items() if r == "stored")
    assert backend.take(sample_key(NS_A, taken), "augmented", codec.decode) is not None
    assert backend.take(sample_key(NS_A, taken), "augmented", codec.decode) is None
    # the taken entry's shard has room again: a key hashing to it is stored, not refused
    shard = backend._shard(sample_key(NS_A, taken))
    same = next(i for i in range(60, 10_000) if backend._shard(sample_key(NS_A, i)) == shard)
    assert backend.put(sample_key(NS_A, same), "augmented", blob, [NS_A]) == "stored"


def test_a_smaller_share_drops_entries_in_every_shard(backend) -> None:
    blob = _blob(0)
    cost = entry_cost(24, len(blob))
    backend.set_budgets({"decoded": 40 * cost, "encoded": 0})
    for i in range(40):
        backend.put(sample_key(NS_A, i), "decoded", blob, [NS_A])
    backend.set_budgets({"decoded": 12 * cost, "encoded": 28 * cost})
    assert backend.scan_bytes() == backend.usage()["decoded"] <= 12 * cost
    assert backend.budget("encoded") == 28 * cost


def test_a_pickled_copy_sees_the_same_shards_and_split(backend) -> None:
    backend.set_budgets({"decoded": 2_000_000, "encoded": 1_000_000})
    backend.put(sample_key(NS_A, 5), "decoded", _blob(5, 100), [NS_A])
    copy = pickle.loads(pickle.dumps(backend))
    assert len(copy.shards) == SHARDS and copy.budgets == backend.budgets
    assert copy.usage() == backend.usage()
    np.testing.assert_array_equal(copy.get(sample_key(NS_A, 5), codec.decode),
                                  np.full(100, 5, np.uint8))


def _writer(backend: MemoryBackend, first: int, count: int, blob: bytes) -> None:
    for i in range(first, first + count):
        backend.put(sample_key(NS_A, i), "decoded", blob, [NS_A])


def test_processes_writing_at_once_keep_the_accounting_exact(backend) -> None:
    """Two forked writers put into every shard at the same time until the tier is full: the
    bytes counted equal the bytes read back, within budget, and every key is stored once."""
    blob = _blob(0, 20_000)
    cost = entry_cost(24, len(blob))
    backend.set_budgets({"decoded": 60 * cost})
    backend.close_here()  # no environment open across the fork
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(backend, k * 100, 100, blob)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    keys = [k for s in backend.shards for k in _keys(s)]
    assert len(keys) == len(set(keys))
    assert backend.scan_bytes() == backend.usage()["decoded"] == len(keys) * cost <= 60 * cost
    assert len(keys) > 60 - SHARDS


def test_the_client_keeps_storing_past_a_full_shard(backend) -> None:
    """A full shard refuses its keys but does not stop the client (its ``full`` set): other
    shards still take theirs, and the client stops encoding only once every shard said so."""
    value = np.zeros(10_000, np.uint8)
    cost = entry_cost(24, len(codec.encode(value)))
    backend.set_budgets({"decoded": SHARDS * 6 * cost})  # six entries a shard
    layout = TierLayout((Tier("decoded", 1, False, False, "p" * 16),), 2)
    client = CacheClient(layout, backend, Counters(mp.get_context("fork"), 1), ("decoded",))
    ns = layout.tiers[0].namespace(0, 0)
    by_shard: dict[int, list[int]] = {}
    for i in range(1000):
        by_shard.setdefault(backend._shard(sample_key(ns, i)), []).append(i)
    # shard 0 first, more than it holds; then every other shard's keys
    order = by_shard[0][:10] + [i for k in range(1, SHARDS) for i in by_shard[k][:8]]

    def store(i: int) -> str:
        before = client.counters.totals()
        ins = client.inserter(i, 0, 0, 0, 0)
        if ins is None:
            return "skipped"
        ins.after_step(1, value)
        ins.commit()
        after = client.counters.totals()
        return "stored" if after["inserts"] > before["inserts"] else "refused"

    results = [store(i) for i in order[:10]]
    assert results == ["stored"] * 6 + ["refused"] * 4  # shard 0 full...
    assert "decoded" not in client.full
    results += [store(i) for i in order[10:]]
    assert results[10:18] == ["stored"] * 6 + ["refused"] * 2  # ...shard 1 still took six
    assert results[-1] == "skipped" and "decoded" in client.full  # all full: it stopped
    assert client.counters.totals()["inserts"] == SHARDS * 6
    assert backend.scan_bytes() == backend.usage()["decoded"] == SHARDS * 6 * cost


def _fill(client: CacheClient, first: int, epoch: int) -> int:
    """Inserts ``client`` made of 40 samples from ``first`` in ``epoch``."""
    before = client.counters.totals()["inserts"]
    value = np.zeros(10_000, np.uint8)
    for i in range(first, first + 40):
        ins = client.inserter(i, 0, epoch, 0, 0)
        if ins is not None:
            ins.after_step(1, value)
            ins.commit()
    return client.counters.totals()["inserts"] - before


def test_a_worker_tries_full_shards_again_in_the_next_epoch(backend) -> None:
    """A worker's copy remembers full shards within an epoch only: the training process may
    raise the tier's budget between epochs (the MDP's replan), and persistent workers must
    then fill the room."""
    cost = entry_cost(24, len(codec.encode(np.zeros(10_000, np.uint8))))
    backend.set_budgets({"decoded": 8 * cost})
    layout = TierLayout((Tier("decoded", 1, False, False, "p" * 16),), 2)
    counters = Counters(mp.get_context("fork"), 1)
    worker = CacheClient(layout, pickle.loads(pickle.dumps(backend)), counters, ("decoded",))
    assert 0 < _fill(worker, 0, epoch=0) <= 8
    assert "decoded" in worker.full
    backend.set_budgets({"decoded": 40 * cost})  # in the training process
    assert _fill(worker, 100, epoch=0) == 0  # same epoch: it remembers
    assert _fill(worker, 100, epoch=1) > 8  # next epoch: it tries again, and stores


@pytest.mark.parametrize("value", [
    torch.zeros(3, dtype=torch.cfloat).conj(),  # no NumPy view: RuntimeError
    "caf\udce9",  # a lone surrogate (os.fsdecode of a Latin-1 name): UnicodeEncodeError
])
def test_a_form_that_fails_to_encode_is_not_stored_and_does_not_fail_its_sample(backend, value):
    backend.set_budgets({"decoded": 1 << 20})
    layout = TierLayout((Tier("decoded", 1, False, False, "p" * 16),), 2)
    client = CacheClient(layout, backend, Counters(mp.get_context("fork"), 1), ("decoded",))
    ins = client.inserter(0, 0, 0, 0, 0)
    ins.after_step(1, value)  # raised out of the worker's run: the worker died
    ins.commit()
    totals = client.counters.totals()
    assert totals["uncacheable"] == 1 and totals["inserts"] == 0
