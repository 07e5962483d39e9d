"""A run whose forms the cost rule has off (``CacheClient.worth_storing``) stores nothing, so it
runs plain: no ``after_step`` at each step, no draws watched (``cache/running.py``); what it
would have counted is counted after it (``Insert.settle``), and a part of it handed off says it
may have drawn, so the worker finishing it stores no form every epoch would read."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import pytest

import headrace as hr
from headrace.cache.client import MIN_MEASURED, CacheClient, Counters
from headrace.cache.insert import MAY_HAVE_DRAWN
from headrace.cache.running import run_cached
from headrace.cache.tiers import TierLayout
from headrace.pipeline.runner import SampleRunner, StepTiming
from tests.unit.cache_steps import Floats, draws, flip, memory_cache, scale

PIPE = hr.Pipeline(Floats(40), [hr.step(draws), hr.step(scale), hr.step(flip, random=True)])
"""The decoded form is the output of ``scale`` (position 2), after ``draws`` drew unseeded."""
PLAIN = hr.Pipeline(Floats(40), [hr.step(scale), hr.step(scale), hr.step(flip, random=True)])


@pytest.fixture
def backend():
    with memory_cache() as b:
        yield b


def _client(pipe: hr.Pipeline, backend: Any, counters: Counters, off: bool) -> CacheClient:
    """A client of ``pipe``'s decoded form; ``off``: its rule measured the steps the form
    saves at a microsecond and its encoding at a second (not worth storing)."""
    c = CacheClient(TierLayout.for_pipeline(pipe), backend, counters, ("decoded",))
    if off:
        for _ in range(MIN_MEASURED):
            c.observe([StepTiming(i, 1e-6, 1e-6) for i in range(4)], row=0)
            c.encoded("decoded", 1.0)
    return c


def _recording(runner: SampleRunner, seen: list[dict[str, Any]]) -> Any:
    def run(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return runner.run(*args, **kwargs)
    return run


def test_a_run_storing_nothing_is_neither_followed_step_by_step_nor_watched(backend) -> None:
    counters = Counters(mp.get_context("fork"), 1)
    client = _client(PLAIN, backend, counters, off=True)
    seen: list[dict[str, Any]] = []
    run = _recording(SampleRunner(PLAIN), seen)
    for i in range(10):  # fewer than PROBE_EVERY: no probe stores
        out = run_cached(client, run, i, 0, None, 0, 0, 0)
        assert out.error is None and out.next_step is None
    assert all("after_step" not in k and "on_drew" not in k for k in seen)
    totals = counters.totals()
    assert (totals["inserts"], totals["not_stored"], totals["drew"]) == (0, 10, 0)


def test_a_form_not_worth_storing_counts_so_also_where_a_step_drew(backend) -> None:
    """``not_stored`` comes before ``drew`` (the rule is asked before the run, whose draws
    are then not watched): ``drew`` counts forms the rule would have stored."""
    counters = Counters(mp.get_context("fork"), 1)
    off = _client(PIPE, backend, counters, off=True)
    for i in range(3):
        run_cached(off, SampleRunner(PIPE).run, i, 0, None, 0, 0, 0)
    totals = counters.totals()
    assert (totals["inserts"], totals["not_stored"], totals["drew"]) == (0, 3, 0)
    on = _client(PIPE, backend, counters, off=False)  # nothing measured: stored, if not drawn
    run_cached(on, SampleRunner(PIPE).run, 3, 0, None, 0, 0, 0)
    totals = counters.totals()
    assert (totals["inserts"], totals["not_stored"], totals["drew"]) == (0, 3, 1)


@pytest.mark.parametrize("pipe", [PIPE, PLAIN])
def test_a_part_not_watched_and_handed_off_may_have_drawn(backend, pipe) -> None:
    # the worker that starts it has the rule off and does not watch its draws; the one
    # finishing it would store the decoded form: it must not, unless it knows the first part
    # drew nothing (``draws``, before the hand-off, makes it differ every epoch)
    counters = Counters(mp.get_context("fork"), 2)
    first, second = _client(pipe, backend, counters, True), _client(pipe, backend, counters, False)
    seen: list[dict[str, Any]] = []
    runner = SampleRunner(pipe)
    part = run_cached(first, _recording(runner, seen), 5, 0, None, 0, 0, 0,
                      hand_off=lambda next_step, _spent: next_step == 2)
    assert part.next_step == 2 and "on_drew" not in seen[0]
    assert part.drew_at == MAY_HAVE_DRAWN  # not watched: it may have drawn anywhere
    rest = run_cached(second, runner.run, 5, part.next_step, part.value, 0, 0, 1, part.drew_at)
    assert rest.next_step is None and rest.drew_at == MAY_HAVE_DRAWN
    totals = counters.totals()  # counted as the first part judged the form: not seen drawing
    assert (totals["inserts"], totals["not_stored"], totals["drew"]) == (0, 1, 0)
    assert second.lookup(5, 0, 0, 1) is None


def test_each_tier_the_rule_keeps_out_is_still_stored_one_in_probe_every(backend) -> None:
    # a review: every run asks the rule of two forms, and one count for both made the
    # one-in-32 probe fall on the second form every time: the first was never stored again,
    # so its encoding median never moved
    from headrace.cache.client import PROBE_EVERY

    backend.set_budgets({"encoded": 1_000_000, "decoded": 1_000_000})
    counters = Counters(mp.get_context("fork"), 1)
    client = CacheClient(TierLayout.for_pipeline(PLAIN), backend, counters,
                         ("encoded", "decoded"))
    assert sorted(client.at_position.values()) == ["decoded", "encoded"]
    for _ in range(MIN_MEASURED):
        client.observe([StepTiming(i, 1e-6, 1e-6) for i in range(4)], row=0)
        for tier in ("encoded", "decoded"):
            client.encoded(tier, 1.0)
    probed = {"encoded": 0, "decoded": 0}
    for i in range(4 * PROBE_EVERY):
        ins = client.inserter(i, 0, 0, 0, 0)
        assert ins is not None
        for tier in ins.worth or ():
            probed[tier] += 1
    assert probed == {"encoded": 4, "decoded": 4}
