"""Remote workers (Ray actors on the CPU nodes of a real local cluster) behind the scheduler."""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.remote import Remote
from tests.helpers import (
    ArraySource,
    fail_on_7,
    ident_collate,
    jitter,
    on_node,
    slow_on_4,
    tweak,
)

pytestmark = pytest.mark.ray

ON_CPU_NODES = {"cpu_node": 1}


def cpu_nodes() -> set[str]:
    """Ids of the cluster's nodes with the ``cpu_node`` resource: where remote workers run,
    never the training host (Ray's node table)."""
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Resources"].get("cpu_node")}


def remote_opts(**kw) -> hr.Options:
    return hr.Options(seed=11, remote=Remote(address="auto", max_workers=3,
                                             resources=ON_CPU_NODES, **kw))


def wait_until(cond, timeout_s: float = 60.0) -> None:
    """Bounded wait for a condition another thread makes true (checked every 20 ms)."""
    tick = threading.Event()
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        tick.wait(0.02)


def remote_ready(it, n: int) -> bool:
    return sum(w.ready for w in list(it.pool.workers.values()) if w.external) >= n


def wait_ready(it, n: int, timeout_s: float = 60.0) -> None:
    """Wait until ``n`` of the epoch ``it``'s remote workers are ready: woken by each "ready"
    its scheduler handles (``Scheduler.readiness``), not polled."""
    with it.scheduler.readiness:
        assert it.scheduler.readiness.wait_for(lambda: remote_ready(it, n), timeout_s), \
            f"{n} remote workers not ready in {timeout_s} s"


def by_index(batches) -> dict[int, dict]:
    return {s["i"]: s for b in batches for s in b}


def pipeline(n: int = 48) -> hr.Pipeline:
    return hr.Pipeline(ArraySource(n), [hr.step(jitter, name="jitter", random=True)])


def pipeline_on_node(n: int = 48) -> hr.Pipeline:
    """``pipeline(n)`` and a last step recording the Ray node that ran the sample ("node")."""
    return hr.Pipeline(ArraySource(n), [hr.step(jitter, name="jitter", random=True),
                                        hr.step(functools.partial(on_node, "node"), name="where")])


def slow_lane_pipe() -> hr.Pipeline:
    """Every 4th sample takes 100 ms in "slow1" and again in "slow2" (``slow_on_4``)."""
    return hr.Pipeline(ArraySource(80), [hr.step(slow_on_4, name="slow1"),
                                         hr.step(jitter, name="jitter", random=True),
                                         hr.step(slow_on_4, name="slow2")])


SLOW_LANE_TIMEOUT = hr.TimeoutConfig(fixed_s=0.03)
LOCAL_RUNS = {
    "shuffled": lambda: hr.DataLoader(pipeline(), batch_size=4, shuffle=True, num_workers=1,
                                      collate_fn=ident_collate, options=hr.Options(seed=11)),
    "in order": lambda: hr.DataLoader(pipeline(), batch_size=4, num_workers=1,
                                      collate_fn=ident_collate, options=hr.Options(seed=11)),
    "slow lane": lambda: hr.DataLoader(slow_lane_pipe(), batch_size=4, num_workers=1,
                                       collate_fn=ident_collate,
                                       options=hr.Options(seed=4, timeout=SLOW_LANE_TIMEOUT)),
}
"""The all-local runs the remote runs are compared with, each used by two tests."""


@pytest.fixture(scope="module")
def local_run():
    """``local_run(name)``: samples by index of one epoch of ``LOCAL_RUNS[name]``, run once
    for the module (a copy each time: a test may not change another's reference)."""
    done: dict[str, dict[int, dict]] = {}

    def get(name: str) -> dict[int, dict]:
        if name not in done:
            loader = LOCAL_RUNS[name]()
            try:
                done[name] = by_index(list(loader))
            finally:
                loader.close()
        return copy.deepcopy(done[name])

    return get


def test_remote_samples_equal_local_ones(ray_cluster, local_run, no_actor_leaks):
    expected = local_run("shuffled")
    loader = hr.DataLoader(pipeline(), batch_size=4, shuffle=True, num_workers=1,
                           collate_fn=ident_collate, options=remote_opts())
    it = iter(loader)
    wait_ready(it, 3)
    got = by_index(list(it))
    assert loader.remote.remote_samples > 0
    assert sorted(got) == sorted(expected) == list(range(48))
    for i, s in expected.items():
        r = got[i]
        assert torch.equal(r["t"], s["t"]) and r["t"].dtype == s["t"].dtype
        assert np.array_equal(r["a"], s["a"]) and r["a"].dtype == s["a"].dtype
        assert r["n"] == s["n"]
    loader.close()


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_each_index_exactly_once_with_default_collate(ray_cluster, no_actor_leaks, executor):
    opts = hr.Options(seed=3, executor=executor,
                      remote=Remote(max_workers=2, resources=ON_CPU_NODES))
    loader = hr.DataLoader(pipeline(40), batch_size=5, shuffle=True, num_workers=1,
                           options=opts)
    for _ in range(2):  # two epochs: the remote workers of the first are gone
        it = iter(loader)
        wait_ready(it, 2)
        seen = Counter(int(i) for b in it for i in b["i"])
        assert seen == Counter(range(40))
    assert loader.remote.remote_samples > 0
    del it, loader


def shift_in_place(batch: list) -> list:
    """A collate_fn normalising in place, as many do."""
    for s in batch:
        s["a"] -= 0.5
    return batch


@pytest.mark.timeout(120)
def test_remote_samples_hold_writable_arrays(ray_cluster, local_run, no_actor_leaks):
    # NumPy arrays came out of Ray's object store as read-only views: an in-place change in a
    # collate_fn failed for remotely computed samples only (local ones are writable, as torch's)
    expected = local_run("in order")
    loader = hr.DataLoader(pipeline(), batch_size=4, num_workers=1, collate_fn=shift_in_place,
                           options=remote_opts())
    it = iter(loader)
    wait_ready(it, 3)
    got = by_index(list(it))
    assert loader.remote.remote_samples > 0
    for i, s in expected.items():
        assert got[i]["a"].flags.writeable and got[i]["t"].numpy().flags.writeable
        assert np.array_equal(got[i]["a"], s["a"] - 0.5)
    loader.close()


def test_source_read_locally_when_not_reachable(ray_cluster, local_run, no_actor_leaks):
    expected = local_run("in order")
    loader = hr.DataLoader(pipeline(), batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=remote_opts(read_source=False))
    it = iter(loader)
    wait_ready(it, 3)
    got = by_index(list(it))
    assert loader.remote.remote_samples > 0
    for i, s in expected.items():
        assert torch.equal(got[i]["t"], s["t"]) and got[i]["n"] == s["n"]
    loader.close()


def test_remote_step_error_names_sample_and_step(ray_cluster, no_actor_leaks):
    pipe = hr.Pipeline(ArraySource(40), [hr.step(jitter, name="jitter", random=True),
                                         hr.step(fail_on_7, name="check")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=remote_opts())
    with pytest.raises(hr.StepError) as ei:
        list(loader)
    assert ei.value.index == 7 and ei.value.step == "check"
    assert isinstance(ei.value, ValueError)
    loader.close()

    skip = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                         options=hr.Options(on_error="skip", remote=Remote(
                             max_workers=2, resources=ON_CPU_NODES)))
    assert sorted(s["i"] for b in skip for s in b) == [i for i in range(40) if i != 7]
    skip.close()


def test_split_remote_prefix_local_suffix(ray_cluster, no_actor_leaks):
    # FastFlow's split: remote workers run steps [0, 2) (load, jitter) and hand the sample
    # back; local workers run the rest from there. Same samples as all-local. (Worker
    # processes: these steps draw from the global generators too, which threads share.)
    def pipe():
        return hr.Pipeline(ArraySource(40), [hr.step(jitter, name="jitter", random=True),
                                             hr.step(tweak, name="tweak", random=True)])

    local = hr.DataLoader(pipe(), batch_size=4, num_workers=1, collate_fn=ident_collate,
                          options=hr.Options(seed=2))
    expected = by_index(list(local))
    loader = hr.DataLoader(pipe(), batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=2, remote=Remote(
                               max_workers=2, resources=ON_CPU_NODES)))
    loader.remote.stop = 2
    it = iter(loader)
    wait_ready(it, 2)
    got = by_index(list(it))
    assert sorted(got) == list(range(40))
    assert it.stats().slow_samples > 0  # handed back at the split point, finished locally
    for i, s in expected.items():
        assert torch.equal(got[i]["t"], s["t"]) and got[i]["n2"] == s["n2"]
        assert got[i]["n"] == s["n"]
    loader.close()


def test_persistent_remote_workers_serve_later_epochs(ray_cluster, no_actor_leaks):
    loader = hr.DataLoader(pipeline(40), batch_size=4, num_workers=1, persistent_workers=True,
                           options=remote_opts())
    it = iter(loader)
    wait_ready(it, 3)
    assert Counter(int(i) for b in it for i in b["i"]) == Counter(range(40))
    first = loader.remote.remote_samples
    assert loader.remote.ready_workers() == 3  # the same actors, still placed between epochs
    it = iter(loader)
    assert Counter(int(i) for b in it for i in b["i"]) == Counter(range(40))
    assert loader.remote.remote_samples > first
    del it
    loader.close()


def test_resume_mid_epoch_from_a_remote_run(ray_cluster, local_run, no_actor_leaks):
    expected = local_run("shuffled")  # without the "where" step: the same content
    # 8 samples in flight at most: the local worker cannot run most of the epoch alone
    # while the remote workers start (at the default cap the first 5 batches all ran locally)
    opts = hr.Options(seed=11, max_in_flight=8, remote=Remote(
        max_workers=3, resources=ON_CPU_NODES))
    loader = hr.DataLoader(pipeline_on_node(), batch_size=4, shuffle=True, num_workers=1,
                           collate_fn=ident_collate, options=opts)
    it = iter(loader)
    wait_ready(it, 3)
    remote = cpu_nodes()
    delivered = []
    for batch in it:  # up to the first batch holding a sample a remote worker ran
        delivered.append(batch)
        if any(s["node"] in remote for s in batch):
            break
    first = by_index(delivered)
    # the state dict is taken from a run that delivered samples run on the CPU nodes, with
    # samples left to resume
    assert any(s["node"] in remote for s in first.values()) and len(first) < 48
    state = loader.state_dict()
    del it
    loader.close()
    # resumed on local workers only: the samples not yet delivered, with the same content
    resumed = hr.DataLoader(pipeline_on_node(), batch_size=4, shuffle=True, num_workers=1,
                            collate_fn=ident_collate, options=hr.Options(seed=11))
    resumed.load_state_dict(state)
    rest = by_index(list(resumed))
    assert sorted([*first, *rest]) == list(range(48)) and not set(first) & set(rest)
    for i, s in {**first, **rest}.items():
        assert torch.equal(s["t"], expected[i]["t"]) and s["n"] == expected[i]["n"]
    assert not any(s["node"] in remote for s in rest.values())  # no Remote: none ran there


def test_offload_ratio_caps_the_remote_share(ray_cluster, no_actor_leaks):
    loader = hr.DataLoader(pipeline(120), batch_size=4, num_workers=1, persistent_workers=True,
                           options=remote_opts())
    try:
        it = iter(loader)
        wait_ready(it, 3)
        list(it)  # first epoch: no limit
        loader.remote.ratio = 0.25
        base = loader.remote.remote_samples
        got = Counter(int(i) for b in loader for i in b["i"])
        assert got == Counter(range(120))
        share = loader.remote.remote_samples - base
        assert 0 < share <= 0.25 * 120 + 3  # the ratio plus one sample per remote worker
    finally:
        loader.close()


def test_slow_lane_samples_finish_on_remote_workers(ray_cluster, local_run, no_actor_leaks):
    # every 4th sample takes 100 ms in "slow1" (over the fixed 30 ms timeout) and is handed off
    # with jitter and slow2 left; remote workers take such samples first (Remote(slow_lane))
    expected = local_run("slow lane")
    loader = hr.DataLoader(slow_lane_pipe(), batch_size=4, num_workers=1,
                           collate_fn=ident_collate,
                           options=hr.Options(seed=4, timeout=SLOW_LANE_TIMEOUT, remote=Remote(
                               max_workers=2, resources=ON_CPU_NODES, slow_lane=True)))
    try:
        it = iter(loader)
        wait_ready(it, 2)
        got = by_index(list(it))
        assert sorted(got) == list(range(80))
        assert loader.stats().last.slow_samples > 0
        assert loader.remote.resumed_remote > 0
        for i, s in expected.items():
            assert torch.equal(got[i]["t"], s["t"]) and got[i]["n"] == s["n"]
    finally:
        loader.close()


def test_remote_workers_hand_slow_samples_off(ray_cluster, local_run, no_actor_leaks):
    # every 4th sample takes 100 ms in "slow1" (over the fixed 30 ms timeout) with jitter and
    # slow2 left: a remote worker hands it back after slow1, as a local worker would, and it
    # finishes in the slow lane (on whichever worker takes slow-lane samples)
    expected = local_run("slow lane")
    loader = hr.DataLoader(slow_lane_pipe(), batch_size=4, num_workers=1,
                           collate_fn=ident_collate,
                           options=hr.Options(seed=4, timeout=SLOW_LANE_TIMEOUT, remote=Remote(
                               max_workers=2, resources=ON_CPU_NODES)))
    try:
        it = iter(loader)
        wait_ready(it, 2)
        got = by_index(list(it))
        assert sorted(got) == list(range(80))  # exactly once
        assert loader.remote.handed_off_remote > 0
        assert loader.stats().last.slow_samples >= loader.remote.handed_off_remote
        for i, s in expected.items():  # same content, wherever each part ran
            assert torch.equal(got[i]["t"], s["t"]) and got[i]["n"] == s["n"]
    finally:
        loader.close()
