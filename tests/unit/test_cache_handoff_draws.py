"""Where a sample drew from a global generator travels with it across a hand-off
(``cache/running.py``), also from a worker that stores nothing itself: two clients on one
memory cache stand for the two workers of a hand-off."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import headrace as hr
from headrace.cache.client import CacheClient, Counters
from headrace.cache.running import run_cached
from headrace.cache.tiers import TierLayout
from headrace.pipeline.runner import SampleRunner
from tests.unit.cache_steps import Floats, draws, flip, memory_cache, scale

PIPE = hr.Pipeline(Floats(4), [hr.step(draws), hr.step(scale), hr.step(flip, random=True)])
DRAWS = 1  # the position of ``draws`` (``load`` is 0)


@pytest.fixture
def clients():
    with memory_cache() as backend:
        layout = TierLayout.for_pipeline(PIPE)
        counters = Counters(mp.get_context("fork"), 2)
        yield [CacheClient(layout, backend, counters, ("decoded",)) for _ in range(2)]


def test_a_part_that_stores_nothing_still_says_where_it_drew(clients) -> None:
    # the first worker found the decoded tier full earlier this epoch (its own view: it
    # inserts nothing), the one the sample goes to has room; the second part stored the
    # decoded form after the first part's draw, for every later epoch
    first, second = clients
    first.namespaces(0, 0)
    first.full.add("decoded")
    runner = SampleRunner(PIPE)
    part = run_cached(first, runner.run, 3, 0, None, 0, 0, 0,
                      hand_off=lambda next_step, _spent: next_step == DRAWS + 1)
    assert part.next_step == DRAWS + 1 and part.drew_at == DRAWS
    rest = run_cached(second, runner.run, 3, part.next_step, part.value, 0, 0, 1,
                      part.drew_at)
    assert rest.next_step is None and rest.drew_at == DRAWS
    totals = second.counters.totals()
    assert (totals["inserts"], totals["drew"]) == (0, 1)
    assert second.lookup(3, 0, 0, 1) is None  # nothing a later epoch could be served


LATE = hr.Pipeline(Floats(4), [hr.step(scale), hr.step(flip, random=True), hr.step(draws)])
"""A draw after the decoded form's step (1): it changes no form a tier other than the seeded
augmented one stores."""


def test_only_the_steps_up_to_the_last_unseeded_form_are_watched_for_draws() -> None:
    layout = TierLayout.for_pipeline(LATE)
    assert {t.name: (t.position, t.seeded) for t in layout.tiers}["decoded"] == (1, False)

    def through(*active: str) -> int:
        return CacheClient(layout, None, Counters(mp.get_context("fork"), 1),
                           active).draws_matter_through

    assert (through("decoded"), through("decoded", "augmented"), through("encoded")) == (1, 1, 0)
    assert through("augmented") == through() == -1  # a seeded form is stored drawn or not
    with memory_cache() as backend:
        client = CacheClient(layout, backend, Counters(mp.get_context("fork"), 1), ("decoded",))
        told: list[int] = []
        runner = SampleRunner(LATE, on_global_draw=told.append)  # watches every step itself
        out = run_cached(client, runner.run, 2, 0, None, 0, 0, 0)
        assert told == [3]  # the late step drew...
        assert out.drew_at is None  # ...and the inserter was not told: it stores nothing after it
        totals = client.counters.totals()
        assert (totals["inserts"], totals["drew"]) == (1, 0)
        hit = client.lookup(2, 0, 0, 0)  # (a first hit is one to check: a ``Check``)
        assert hit is not None and hit[0] == 2  # the decoded form: resumes at step 2
