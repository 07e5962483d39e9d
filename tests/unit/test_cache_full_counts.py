"""``CacheStats.full`` counts every sample run a full budget kept out of the cache, also once a
worker stopped trying: lookups that missed = runs that stored a form + runs that stored none
because the budget was full."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from headrace.cache import codec, memory_backend
from headrace.cache.client import CacheClient, Counters
from headrace.cache.counters import FAILURE_BYTES
from headrace.cache.memory_backend import MemoryBackend, entry_cost
from headrace.cache.tiers import Tier, TierLayout

VALUE = np.zeros(10_000, np.uint8)
COST = entry_cost(24, len(codec.encode(VALUE)))


@pytest.fixture
def backend():
    path = memory_backend.make_dir()
    b = MemoryBackend(path, 4_000_000, shards=1)
    yield b
    memory_backend.remove_dir(path)
    assert not os.path.exists(path)


def _run(client: CacheClient, i: int, start: int, epoch: int = 0) -> None:
    """One sample run from step ``start`` to the end (2 steps after load), as ``run_cached``."""
    ins = client.inserter(i, 0, epoch, start, 0)
    if ins is not None:
        for position in range(start, 2):
            ins.after_step(position, VALUE)
        ins.commit()


def test_runs_after_the_tier_was_found_full_count_as_full(backend) -> None:
    backend.set_budgets({"decoded": 6 * COST})
    layout = TierLayout((Tier("decoded", 1, False, False, "p" * 16),), 2)
    client = CacheClient(layout, backend, Counters(mp.get_context("fork"), 1), ("decoded",))
    for epoch in range(2):
        for i in range(20):
            _run(client, 100 * epoch + i, 0, epoch)
    t = client.counters.totals()
    assert "decoded" in client.full  # the worker stopped trying after the first refusal...
    assert t["inserts"] == 6 and t["full"] == 40 - 6  # ...and each run after it still counts


def test_a_skipped_form_counts_only_when_the_run_stores_nothing(backend) -> None:
    """Two tiers, the decoded one full: a run from step 0 stores its encoded form instead (an
    insert, not full, also when its decoded form was refused); a run resuming after an encoded
    hit has only the decoded form to store, skipped: counted, once."""
    backend.set_budgets({"encoded": 20 * COST, "decoded": 0})
    layout = TierLayout((Tier("decoded", 1, False, False, "d" * 16),
                         Tier("encoded", 0, False, False, "e" * 16)), 2)
    client = CacheClient(layout, backend, Counters(mp.get_context("fork"), 1),
                         ("encoded", "decoded"))
    _run(client, 0, 0)  # decoded refused, encoded stored: an insert
    assert client.full == {"decoded"}
    _run(client, 1, 0)  # decoded skipped, encoded stored: an insert
    _run(client, 2, 1)  # only decoded: skipped, stored nothing: full
    t = client.counters.totals()
    assert (t["inserts"], t["full"]) == (2, 1)  # one outcome a run


def test_a_failure_is_redacted_before_it_is_cut_to_its_rows_bytes(backend) -> None:
    """A backend error naming a server late in its text: kept cut to ``FAILURE_BYTES`` and
    redacted when logged, the cut fell between the password and its ``@``, and the password
    was logged as it was."""
    layout = TierLayout((Tier("decoded", 1, False, False, "p" * 16),), 2)
    client = CacheClient(layout, backend, Counters(mp.get_context("fork"), 1), ("decoded",))
    head = "x" * (FAILURE_BYTES - 40)
    client.failed(0, ConnectionError(f"{head} redis://:sekretsekretsekret@host:6379/0"))
    kept = client.counters.first_failure()
    assert kept is not None and kept.startswith("ConnectionError: xxx"), kept
    assert "sekret" not in kept, kept
