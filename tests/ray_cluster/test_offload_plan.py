"""FastFlow's offloading decision measured on the job and applied (remote/offload_plan.py)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

import headrace as hr
from headrace.remote import plan_offload
from tests.helpers import ArraySource, busy, busy_on_node
from tests.ray_cluster.test_remote import ON_CPU_NODES, cpu_nodes

pytestmark = pytest.mark.ray


def loader_for(n: int, step=busy) -> hr.DataLoader:
    pipe = hr.Pipeline(ArraySource(n), [hr.step(step, name="busy")])
    return hr.DataLoader(pipe, batch_size=4, num_workers=1, options=hr.Options(
        remote=hr.Remote(max_workers=2, resources=ON_CPU_NODES)))


def test_input_bound_job_offloads_and_runs_remote(ray_cluster, no_actor_leaks):
    loader = loader_for(400, busy_on_node)  # busy, and which Ray node ran the sample
    decision, local = plan_offload(loader, lambda _b: None, batches=8, warmup=1)
    assert local.input_bound  # 1 local worker, 30 ms per sample, an instant train step
    assert decision.offload and decision.ratio > 0
    assert decision.best is not None and decision.best.stop == 2  # the whole pipeline
    assert loader.remote.target >= 1
    before = loader.remote.remote_samples  # plan_offload's own remote run counted too
    batches = list(loader)
    seen = Counter(int(v) // 2 for b in batches for v in b["x"].flatten().tolist())
    assert seen == Counter(range(400))
    remote = cpu_nodes()
    ran_there = sum(node in remote for b in batches for node in b["node"])
    assert ran_there > 0  # the epoch after the decision ran samples on the CPU nodes
    assert loader.remote.remote_samples - before == ran_there  # and says how many
    assert "offload: yes" in loader.explain()
    loader.close()


def test_accelerator_bound_job_does_not_offload(ray_cluster, no_actor_leaks):
    loader = loader_for(200)
    pause = threading.Event()
    decision, local = plan_offload(loader, lambda _b: pause.wait(0.3), batches=4, warmup=1)
    assert not local.input_bound  # 0.3 s per batch of 4 x 30 ms: the model is the bound
    assert not decision.offload and loader.remote.target == 0
    assert "offload: no" in loader.explain()
    loader.close()
