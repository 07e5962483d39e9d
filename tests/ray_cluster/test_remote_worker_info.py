"""What remote workers look like to the user's code and to ``explain()``: a resource no node
has, workers Ray never placed, a torch worker (``get_worker_info()``, ``worker_init_fn``), and
the sample cache they do not use; on the session's Ray cluster."""

from __future__ import annotations

import logging
import re
import time
from collections import Counter

import numpy as np
import pytest
import torch

import headrace as hr
from tests.helpers import ArraySource, ident_collate, jitter
from tests.ray_cluster.conftest import STORAGE_CPUS
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_ready, wait_until

pytestmark = pytest.mark.ray

N = 48


def pipeline(n: int = N) -> hr.Pipeline:
    return hr.Pipeline(ArraySource(n), [hr.step(jitter, name="jitter", random=True)])


MISSPELT = {"cpu_nodes": 1}
"""The session's nodes have ``cpu_node``."""


@pytest.mark.parametrize("required", [True, False])
def test_a_resource_no_node_has_is_named_once_and_the_workers_stay_asked_for(
        ray_cluster, no_actor_leaks, caplog, required):
    # it ran every sample locally without a word, and explain() said "2 remote worker(s)
    # now"; an error at join instead kept a cluster that starts nodes on demand from seeing
    # the workers' demand (a review): a warning, and explain() says why none runs
    loader = hr.DataLoader(pipeline(), batch_size=4, num_workers=1, options=hr.Options(
        remote=hr.Remote(max_workers=2, resources=MISSPELT, required=required)))
    with caplog.at_level(logging.WARNING, logger="headrace"):
        for _ in range(2):
            assert Counter(int(i) for b in loader for i in b["i"]) == Counter(range(N))
    named = [r for r in caplog.records if "'cpu_nodes'" in r.getMessage()]
    assert len(named) == 1, caplog.text
    assert re.search(r"'cpu_nodes', which no node has \(did you mean 'cpu_node'\?\)"
                     r".*live nodes have in all: CPU \d+, cpu_node \d+",
                     named[0].getMessage())
    assert loader.remote.remote_samples == 0
    text = loader.explain()
    assert "0 remote worker(s) now" in text and "'cpu_nodes'" in text, text
    loader.close()


def test_explain_counts_only_the_remote_workers_ray_placed(ray_cluster, no_actor_leaks):
    # 150 cpu_node: the cluster has 200 in all, but no node more than 100, so Ray places
    # neither worker; every sample runs locally
    loader = hr.DataLoader(pipeline(), batch_size=4, num_workers=1, options=hr.Options(
        remote=hr.Remote(max_workers=2, resources={"cpu_node": 150})))
    it = iter(loader)
    try:
        next(it)
        assert sum(w.external for w in it.pool.workers.values()) == 2  # started, not placed
        assert loader.stats().workers == 1  # the local one: no remote worker runs
        text = loader.explain()
        assert "0 remote worker(s) now" in text, text
        assert "2 started, 0 placed so far" in text
        assert sum(len(b["i"]) for b in it) == N - 4
        assert loader.remote.remote_samples == 0
        text = loader.explain()  # between epochs: what the next one starts with
        assert "0 remote worker(s) now" in text, text
        assert "2 asked for, none placed yet" in text
    finally:
        del it
        loader.close()


class ScaledPerWorker(torch.utils.data.Dataset):
    """Two torch idioms: ``__getitem__`` reads ``get_worker_info()`` (never None in a torch
    worker), and a setting that ``worker_init_fn`` put on ``get_worker_info().dataset``."""

    scale = 1.0

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        time.sleep(0.01)  # simulated work
        info = torch.utils.data.get_worker_info()
        return {"i": i, "x": torch.full((3,), float(i)) * self.scale + torch.rand(3),
                "worker": (info.id, info.num_workers, info.seed - info.id,
                           info.dataset is self)}


def scale_by_3(worker_id: int) -> None:
    torch.utils.data.get_worker_info().dataset.scale = 3.0


def fail_off_slot_0(worker_id: int) -> None:
    """Raises in every worker but the local one (slot 0): in the remote workers."""
    if worker_id > 0:
        raise OSError(f"no handle for worker {worker_id}")


def by_index(batches) -> dict[int, dict]:
    return {s["i"]: s for b in batches for s in b}


def scaled_loader(remote) -> hr.DataLoader:
    """``ScaledPerWorker`` configured in ``worker_init_fn``, with ``remote`` (None: local)."""
    return hr.DataLoader(ScaledPerWorker(), batch_size=4, num_workers=1,
                         worker_init_fn=scale_by_3, collate_fn=ident_collate,
                         options=hr.Options(seed=5, remote=remote))


def local_samples() -> dict[int, dict]:
    """The samples of a local run of :func:`scaled_loader`: what the others must equal."""
    local = scaled_loader(None)
    try:
        return by_index(local)
    finally:
        local.close()


def test_remote_workers_are_torch_workers_to_user_code(ray_cluster, no_actor_leaks):
    # get_worker_info() was None on a remote worker (this dataset raised there), and
    # worker_init_fn never ran there: its samples came out unscaled
    expected = local_samples()
    remote = scaled_loader(hr.Remote(max_workers=2, resources=ON_CPU_NODES))
    it = iter(remote)
    try:
        wait_ready(it, 2)
        got = by_index(it)
        assert remote.remote.remote_samples > 0
        assert sorted(got) == list(range(N))
        for i, s in expected.items():  # bit-identical, wherever it ran
            assert torch.equal(got[i]["x"], s["x"]), i
        base = expected[0]["worker"][2]
        assert {s["worker"] for s in expected.values()} == {(0, 1, base, True)}
        ran = Counter(s["worker"] for s in got.values())
        # ids unique, after the local slot, below num_workers: 1 local + 2 remote slots
        assert set(ran) <= {(0, 1, base, True), (1, 3, base, True), (2, 3, base, True)}
        assert sum(n for w, n in ran.items() if w[0] > 0) == remote.remote.remote_samples
    finally:
        del it
        remote.close()


def test_near_storage_fetchers_are_torch_workers_too(storage_node, no_actor_leaks):
    # SOPHON's fetchers are the same actor: the same get_worker_info() and worker_init_fn
    expected = local_samples()
    near = scaled_loader(hr.NearStorage(policy="all-off"))  # the whole sample on a fetcher
    it = iter(near)
    try:
        wait_until(lambda: near.remote.ready_workers() >= STORAGE_CPUS)
        got = by_index(it)
        assert sorted(got) == list(range(N))
        for i, s in expected.items():
            assert torch.equal(got[i]["x"], s["x"]), i
        fetched = [s["worker"] for s in got.values() if s["worker"][0] > 0]
        assert fetched  # 1 local slot, then the fetchers': 1 + STORAGE_CPUS in all
        assert {(w[1], w[2], w[3]) for w in fetched} == {
            (1 + STORAGE_CPUS, expected[0]["worker"][2], True)}
    finally:
        del it
        near.close()


def test_worker_init_fn_failing_on_a_remote_worker_fails_the_epoch(ray_cluster, no_actor_leaks):
    loader = hr.DataLoader(ScaledPerWorker(400), batch_size=4, num_workers=1,
                           worker_init_fn=fail_off_slot_0, collate_fn=ident_collate,
                           options=hr.Options(remote=hr.Remote(max_workers=2,
                                                               resources=ON_CPU_NODES)))
    it = iter(loader)
    try:
        with pytest.raises(hr.WorkerDiedError, match="no handle for worker [12]") as ei:
            wait_until(lambda: loader.remote.placed_total > 0)  # 4 s of samples locally
            list(it)
        assert isinstance(ei.value, OSError)  # what worker_init_fn raised, as locally
    finally:
        del it
        loader.close()


def test_explain_counts_the_samples_that_ran_remotely_without_the_cache(ray_cluster,
                                                                      no_actor_leaks):
    # a sample a remote worker runs is never looked up in the cache nor stored there, and
    # explain() did not say so
    pipe = hr.Pipeline(ArraySource(N), [hr.step(np.copy, name="decode", kind="decode"),
                                        hr.step(jitter, name="jitter", random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=3, handoff=False,
                                              cache=hr.Cache(budget_bytes=16 << 20),
                                              remote=hr.Remote(max_workers=2,
                                                               resources=ON_CPU_NODES)))
    it = iter(loader)
    try:
        wait_ready(it, 2)
        assert sorted(s["i"] for s in by_index(it).values()) == list(range(N))
        uncached = loader.remote.uncached
        assert 0 < uncached == loader.remote.remote_samples
        cache = loader.stats().last.cache
        assert cache is not None
        assert cache.lookups + uncached == N  # every fresh sample: looked up, or remote
        assert (f"remote workers do not use the sample cache: {uncached} sample(s)"
                in loader.explain())
    finally:
        del it
        loader.close()
