"""FastFlow's offloading decided again at run time (remote/replan.py) and the link probe
(remote/link.py), on the session's real Ray cluster."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

import headrace as hr
from headrace.remote import plan_offload
from tests.helpers import ArraySource, busy
from tests.ray_cluster.conftest import STORE_BYTES
from tests.ray_cluster.test_remote import ON_CPU_NODES

pytestmark = pytest.mark.ray

JOINER = {"replan_node": 1}
"""A resource no node has until the test adds one: the cluster holds no remote worker before."""


def test_a_node_joining_mid_run_leads_to_a_new_decision(ray_cluster, no_actor_leaks):
    n = 600  # 30 ms per sample on 1 local worker: about 18 s per epoch alone
    pipe = hr.Pipeline(ArraySource(n), [hr.step(busy, name="busy")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, options=hr.Options(
        cache=None, remote=hr.Remote(max_workers=2, resources=JOINER)))
    decision, local = plan_offload(loader, lambda _b: None, batches=4, warmup=1)
    assert local.input_bound
    assert not decision.offload and "no remote worker" in decision.reason
    assert loader.remote.target == 0 and loader.remote.watcher is not None
    node = None
    try:
        it = iter(loader)
        seen = Counter(int(v) // 2 for v in next(it).flatten().tolist())
        node = ray_cluster.add_node(num_cpus=2, resources={"replan_node": 2},
                                    object_store_memory=STORE_BYTES)
        seen.update(int(v) // 2 for b in it for v in b.flatten().tolist())
        assert seen == Counter(range(n))  # exactly once across the change
        history = loader.remote.watcher.history
        assert history, "the node that joined led to no new decision"
        assert "0 -> 2 remote workers" in history[0].reason
        assert history[0].decision.offload and history[0].remote_workers >= 1
        # the new decision runs: samples finish remotely (within a bounded number of epochs)
        deadline = time.monotonic() + 120
        for _ in range(3):
            if loader.remote.remote_samples > 0 or time.monotonic() > deadline:
                break
            assert sum(len(b) for b in loader) == n
        assert loader.remote.remote_samples > 0
        text = loader.explain()
        assert "offloading decided again" in text and "capacity joined" in text
    finally:
        loader.close()
        if node is not None:
            ray_cluster.remove_node(node)


def test_plan_offload_measures_the_link_and_overrides_win(ray_cluster, no_actor_leaks):
    pipe = hr.Pipeline(ArraySource(200), [hr.step(busy, name="busy")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, options=hr.Options(
        cache=None, remote=hr.Remote(max_workers=2, resources=ON_CPU_NODES)))
    t0 = time.monotonic()
    decision, _ = plan_offload(loader, lambda _b: None, batches=4, warmup=1, remote_batches=0)
    link = loader.remote.link
    assert link is not None and link.samples >= 1
    assert 1e6 < link.bandwidth < 1e12  # bytes/s over this machine's loopback
    assert link.latency_s > 0 and link.cpu_per_byte_s > 0
    assert decision.best is not None
    assert decision.candidates[0].ocycle >= link.overhead_s(0)  # the overhead was used
    assert "link measured:" in loader.explain()
    loader.close()
    # explicit parameters skip the probe
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, options=hr.Options(
        cache=None, remote=hr.Remote(max_workers=2, resources=ON_CPU_NODES)))
    pause = threading.Event()
    plan_offload(loader, lambda _b: pause.wait(0), batches=4, warmup=1, remote_batches=0,
                 bandwidth=1e9, overhead_s=0.0)
    assert loader.remote.link is None and "link measured" not in loader.explain()
    loader.close()
    assert time.monotonic() - t0 < 300
