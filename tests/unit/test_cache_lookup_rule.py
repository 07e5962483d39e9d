"""The cache's lookup rule (``CacheClient.worth_looking_up``): a lookup is made while what it
saves, the steps' time times the share of this epoch's lookups that found a form, outweighs
what it costs; one in ``PROBE_EVERY`` is made all the same. In one process, no workers."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

import headrace as hr
from headrace.cache.client import MIN_MEASURED, PROBE_EVERY, CacheClient, Counters
from headrace.cache.tiers import TierLayout
from headrace.pipeline.runner import StepTiming
from tests.unit.cache_steps import Floats, memory_cache, scale

PIPE = hr.Pipeline(Floats(200, 64), [hr.step(scale)])


@pytest.fixture
def backend():
    with memory_cache() as b:
        yield b


def test_lookups_that_keep_missing_stop_until_an_epoch_that_finds_forms(backend) -> None:
    counters = Counters(mp.get_context("fork"), 1)
    client = CacheClient(TierLayout.for_pipeline(PIPE), backend, counters, ("decoded",))
    (position,) = client.at_position
    for _ in range(MIN_MEASURED):  # the form saves a second of steps: dearer than any lookup
        client.observe([StepTiming(i, 0.5, 0.5) for i in range(2)], row=0)
    n = 4 * PROBE_EVERY
    assert all(client.lookup(i, 0, 0, 0) is None for i in range(n))  # a first epoch: empty
    totals = counters.totals()
    made = totals["lookups"] - totals["not_worth"]
    assert totals["lookups"] == n and MIN_MEASURED <= made <= MIN_MEASURED + n // PROBE_EVERY
    for i in range(n):  # what the first epoch stores
        ins = client.inserter(i, 0, 0, 0, 0)
        assert ins is not None
        ins.after_step(position, np.full(64, 2 * i, np.float32))
        ins.commit()
    assert counters.totals()["inserts"] == n
    found = [client.lookup(i, 0, 1, 0) for i in range(n)]  # the next epoch finds every one
    assert all(f is not None for f in found)
    totals = counters.totals()
    assert totals["hit_decoded"] == n and totals["not_worth"] == n - made
