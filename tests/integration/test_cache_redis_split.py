"""A Redis cache takes MDP's best split at each epoch: the last split is kept only where the
job owns every entry (the memory cache; ``tests/unit/test_cache_split_kept.py``)."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import headrace as hr
from headrace.cache.session import CacheSession
from tests.unit.test_cache_split_kept import BUDGET, Augment, _pipe, _profile

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def test_jobs_sharing_a_redis_cache_split_it_by_the_same_numbers(redis_server):
    """A tier's budget on Redis counts every job's entries: a job keeping its own last split
    (the default, decoded) beside one that started later with a profile (MDP's best, encoded)
    held twice the budget, and the two shared no entry (a review)."""
    redis_server.flush()
    late = CacheSession(hr.Cache(url=redis_server.url, budget_bytes=BUDGET, b_cache=1e12),
                        mp.get_context("fork"), 0, BUDGET)
    early = CacheSession(hr.Cache(url=redis_server.url, budget_bytes=BUDGET, b_cache=1e12),
                         mp.get_context("fork"), 0, BUDGET)
    try:
        pipe = _pipe(Augment(1))
        early.replan(pipe, None, workers=1, in_process=True)
        assert early.split == {"decoded": 1.0}  # the default, before a profile
        for s in (early, late):  # encoded predicted 3% faster: a memory cache keeps decoded
            s.replan(pipe, _profile(3191.0), workers=1, in_process=True)
        assert early.split == late.split == {"encoded": 1.0}
        assert early.plan_best is None
    finally:
        early.close()
        late.close()
