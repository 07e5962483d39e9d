"""ODS's substitution policy on synthetic answers (no server, no processes)."""

from __future__ import annotations

import random

import pytest
from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler

from headrace.cache.ods import NO_ANSWER, Answer, Substitution, eligible
from headrace.cache.ods_board import _redis_bits
from headrace.runtime.bitmap import Bitmap


def test_a_cached_request_is_served_as_asked() -> None:
    s = Substitution()
    assert s.fill([3, 5], Answer([True, True], [7])) == [3, 5]
    assert (s.hits, s.substituted) == (2, 0)


def test_a_miss_is_replaced_by_an_unseen_hit_and_comes_later() -> None:
    s = Substitution()
    assert s.fill([3], Answer([False], [9])) == [9]  # 3 missed: 9 (cached) instead
    assert list(s.deferred) == [3] and s.substituted == 1
    # the sampler now asks for 9, already delivered: the deferred miss fills the position
    assert s.fill([9], Answer([True], [])) == [3]
    assert s.from_deferred == 1 and not s.deferred


def test_seen_candidates_are_not_used() -> None:
    s = Substitution()
    s.fill([1], Answer([True]))
    assert s.fill([2], Answer([False], [1])) == [2]  # 1 seen: the miss is served as asked


def test_no_answer_means_every_request_is_a_miss() -> None:
    s = Substitution()
    assert s.fill([4, 2, 8], NO_ANSWER) == [4, 2, 8]


def _epoch(order: list[int], cached: set[int], rng: random.Random, s: Substitution,
           batch: int = 4, skip: set[int] = frozenset()) -> list[int]:
    """Run ``order`` through ``s`` in sampler batches with a server whose cache is ``cached``
    (entries come and go at random, as other jobs insert and evict)."""
    out = []
    order = [i for i in order if i not in skip]  # a resume skips delivered sampler indices
    for k in range(0, len(order), batch):
        req = order[k:k + batch]
        for _ in range(3):  # other jobs' inserts and evictions
            cached.add(rng.randrange(len(order) + len(skip)))
            if cached and rng.random() < 0.5:
                cached.discard(rng.choice(sorted(cached)))
        unseen = [c for c in cached if c not in s.seen and c not in req]
        rng.shuffle(unseen)
        out += s.fill(req, Answer([i in cached for i in req], unseen[:len(req)]))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_every_index_exactly_once_whatever_the_cache_does(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(1, 200)
    order = rng.sample(range(n), n)
    cached = set(rng.sample(range(n), rng.randrange(n + 1)))
    s = Substitution()
    got = _epoch(order, cached, rng, s, batch=rng.randrange(1, 9))
    assert sorted(got) == list(range(n))
    assert s.hits + s.substituted + s.from_deferred <= n


@pytest.mark.parametrize("seed", range(20))
def test_a_resume_from_the_delivered_set_delivers_exactly_the_rest(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(8, 200)
    order = rng.sample(range(n), n)
    cached = set(rng.sample(range(n), n // 3))
    before = Substitution()
    first = _epoch(order[: rng.randrange(n)], cached, rng, before)
    delivered = Bitmap()
    for i in first[: rng.randrange(len(first) + 1)]:  # dispatched, not all delivered yet
        delivered.set(i)
    after = _epoch(order, cached, rng, Substitution(delivered.copy()),
                   skip={i for i in range(n) if i in delivered})
    done = [i for i in range(n) if i in delivered]
    assert sorted(done + after) == list(range(n))  # the union is the epoch, no duplicate


def test_substitution_happens_when_the_cache_holds_unseen_samples() -> None:
    rng = random.Random(1)
    s = Substitution()
    _epoch(rng.sample(range(100), 100), set(range(0, 100, 5)), rng, s)
    assert s.substituted > 0


def test_eligible_samplers() -> None:
    ds = list(range(10))
    assert eligible(RandomSampler(ds), False, False, 2, 10) is None
    assert eligible(SequentialSampler(ds), False, True, 5, 10) is None  # no tail dropped
    assert "drop_last" in eligible(SequentialSampler(ds), False, True, 3, 10)
    assert "replacement" in eligible(RandomSampler(ds, replacement=True), False, False, 2, 10)
    assert "DistributedSampler" in eligible(
        DistributedSampler(ds, num_replicas=2, rank=0), False, False, 2, 10)
    assert "batch_sampler" in eligible(RandomSampler(ds), True, False, 2, 10)


def test_seen_bits_reach_redis_in_its_bit_order() -> None:
    b = Bitmap()
    for i in (0, 3, 9):
        b.set(i)
    bits = _redis_bits(b.raw())
    # SETBIT offset i is bit 7 - i % 8 of byte i // 8 (most significant first)
    got = {i for i in range(16) if bits[i // 8] >> (7 - i % 8) & 1}
    assert got == {0, 3, 9}
    assert len(bits) == 2
