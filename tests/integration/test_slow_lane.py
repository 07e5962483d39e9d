"""The slow lane: samples over the timeout are handed off and resumed at the next step."""

import time

import numpy as np
import pytest

import headrace as hr
from headrace import units
from headrace.planner import timeout as timeout_policy
from tests.helpers import Trace, TraceSource

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_handed_off_samples_resume_at_the_next_step_and_run_each_step_once(executor, no_leaks):
    # b costs 20 ms: enough work left after a for a hand-off to pay (>= half the timeout)
    steps = [Trace("a", slow_every=4, slow_s=0.05), Trace("b", slow_every=1, slow_s=0.02), Trace("c")]
    pipe = hr.Pipeline(TraceSource(24), [hr.step(s, name=s.name) for s in steps])
    opts = hr.Options(timeout=hr.TimeoutConfig(fixed_s=0.03), executor=executor)
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=3, collate_fn=lambda b: b, options=opts)
    try:
        samples = [s for b in loader for s in b]
        st = loader.stats().last
    finally:
        loader.close()
    assert sorted(s["index"] for s in samples) == list(range(24))
    for s in samples:
        assert [name for name, _ in s["trace"]] == ["load", "a", "b", "c"], s
        if s["index"] % 4 == 0:  # handed off after "a": b and c ran together in the slow lane
            assert s["trace"][2][1] == s["trace"][3][1]
    # the 6 slow ones; on a loaded machine a fast one preempted in "a" may go slow too
    assert st.slow_samples >= 6 and st.slow_samples + st.fast_samples == 24


def test_a_fixed_timeout_hands_off_in_every_epoch(no_leaks):
    # each epoch has a pool of its own (no persistent_workers): the timeout must reach each
    steps = [Trace("a", slow_every=4, slow_s=0.02), Trace("b", slow_every=1, slow_s=0.004)]
    pipe = hr.Pipeline(TraceSource(32), [hr.step(s, name=s.name) for s in steps])
    opts = hr.Options(timeout=hr.TimeoutConfig(fixed_s=0.005), cache=None)  # (a cached sample
    # would run no step in the second epoch)
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, collate_fn=lambda b: b, options=opts)
    try:
        slow = []
        for _ in range(2):
            assert sorted(s["index"] for b in loader for s in b) == list(range(32))
            slow.append(loader.stats().last.slow_samples)
    finally:
        loader.close()
    # the 8 slow ones each epoch, 20 ms after "a" with 4 ms of "b" left; on a loaded machine a
    # fast one preempted in "a" may go slow too
    assert min(slow) >= 8, slow


def test_a_late_sample_with_less_left_than_a_move_costs_stays_on_its_worker(no_leaks,
                                                                          monkeypatch):
    # "a" is slow on every 4th sample (20 ms, far over the 0.5 ms timeout); "b", the step left
    # after it, takes 1 ms: over half the timeout, under what a move costs (HANDOFF_MIN_S).
    # The floor is raised to 50 ms here: a loaded machine measured b's median wall time at
    # 2.2-3.3 ms, past the 2 ms floor, and the late samples moved (6 of 25 runs; a flake hunt).
    # Workers read the module's value when they decide (forked after this).
    monkeypatch.setattr(timeout_policy, "HANDOFF_MIN_S", 0.05)
    steps = [Trace("a", slow_every=4, slow_s=0.02), Trace("b", slow_every=1, slow_s=0.001)]
    pipe = hr.Pipeline(TraceSource(32), [hr.step(s, name=s.name) for s in steps])
    opts = hr.Options(timeout=hr.TimeoutConfig(fixed_s=0.0005), cache=None)
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, collate_fn=lambda b: b, options=opts)
    try:
        for _ in range(2):  # the second epoch knows the steps' times from its first tick
            assert sorted(s["index"] for b in loader for s in b) == list(range(32))
        st = loader.stats().last
    finally:
        loader.close()
    assert st.slow_samples == 0 and st.fast_samples == 32
    # explain() names the floor the workers applied (it said 2 ms while they used 50)
    assert f"at least {units.duration(timeout_policy.HANDOFF_MIN_S)}" in loader.explain()


def test_learned_timeout_lies_between_fast_and_slow_costs(no_leaks):
    # 1 in 16 slow (p90 among fast ones); b leaves enough work after a for hand-offs to pay
    steps = [Trace("a", slow_every=16, slow_s=0.06), Trace("b", slow_every=1, slow_s=0.01), Trace("c")]
    pipe = hr.Pipeline(TraceSource(120), [hr.step(s, name=s.name) for s in steps])
    opts = hr.Options(timeout=hr.TimeoutConfig(warmup_samples=20, update_every=10))
    loader = hr.DataLoader(pipe, batch_size=6, num_workers=3, collate_fn=lambda b: b, options=opts)
    assert sorted(s["index"] for b in loader for s in b) == list(range(120))
    st = loader.stats()
    # p75, or p90 when near-identical fast samples put too many just over p75 (the fallback)
    assert st.timeout_percentile in (75.0, 90.0)
    assert 0.01 <= st.timeout_s < 0.06  # either way the timeout sits among the fast samples
    assert st.last.slow_samples > 0
    assert st.timeout_timeline[0][1] == float("inf")  # warm-up: nothing handed off
    assert 0.01 <= st.timeout_timeline[-1][1] < 0.06


def test_stats_report_stall_throughput_and_queues(no_leaks):
    pipe = hr.Pipeline(TraceSource(30), [hr.step(Trace("a", slow_every=3, slow_s=0.01), name="a")])
    loader = hr.DataLoader(pipe, batch_size=5, num_workers=2, collate_fn=lambda b: b)
    assert sum(len(b) for b in loader) == 30
    e = loader.stats().last
    assert e.finished and e.batches == 6 and e.samples == 30
    assert 0 <= e.stall_s <= e.wall_s and e.samples_per_s > 0
    assert e.main_cpu_per_batch_ms > 0
    assert 0 <= e.stall_fraction <= 1


def test_a_sample_queued_behind_a_slow_one_moves_to_an_idle_worker(no_leaks):
    # Sample 0 runs 1.5 s; the sample queued behind it on the same worker would wait for it.
    # Once the other worker has nothing left to do, it takes that sample over.
    pipe = hr.Pipeline(TraceSource(12), [hr.step(Trace("a", slow_every=1, slow_s=0.02), name="a"),
                                         hr.step(Trace("b", slow_every=100, slow_s=1.5), name="b")])
    opts = hr.Options(timeout=hr.TimeoutConfig(fixed_s=0.1), handoff=False)
    loader = hr.DataLoader(pipe, batch_size=1, sampler=list(range(12)), num_workers=2,
                           collate_fn=lambda b: b, options=opts, in_order=False)
    order = [s["index"] for b in loader for s in b]
    assert sorted(order) == list(range(12))  # exactly once
    assert order[-1] == 0  # nothing waited behind the slow sample
    assert loader.stats().last.moved_samples == 1


class _Big:
    """Makes a 600 KB array from the index (sleeping ``cost_s`` to simulate work)."""

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s

    def __call__(self, x: dict) -> dict:
        time.sleep(self.cost_s)
        return {"index": x["index"], "data": np.full(150_000, x["index"], dtype=np.float32)}


class _Sum:
    """Reduces that array (sleeping ``cost_s`` to simulate work)."""

    def __init__(self, cost_s: float) -> None:
        self.cost_s = cost_s

    def __call__(self, x: dict) -> dict:
        time.sleep(self.cost_s)
        return {"index": x["index"], "total": float(x["data"].sum())}


def test_hand_off_payloads_larger_than_a_pipe_reach_the_next_worker(no_leaks):
    # Every sample is handed off after "big" with a 600 KB partial value; the tasks carrying it
    # go to busy workers, so their pipes fill and the scheduler waits for them to drain.
    pipe = hr.Pipeline(TraceSource(16), [hr.step(_Big(0.02), name="big"),
                                         hr.step(_Sum(0.02), name="sum")])
    opts = hr.Options(timeout=hr.TimeoutConfig(fixed_s=0.005))
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, collate_fn=lambda b: b, options=opts)
    samples = [s for b in loader for s in b]
    assert sorted(s["index"] for s in samples) == list(range(16))
    assert all(s["total"] == 150_000 * s["index"] for s in samples)  # the payload arrived whole
    assert loader.stats().last.slow_samples == 16
    # what forwarding a 600 KB partial value cost this process is measured and explained; it
    # is far below the 20 ms "sum" step left, so every late sample still moved
    assert 0 < loader.monitor.move_cost_s < 0.02
    assert "a move costs this process" in loader.explain()
