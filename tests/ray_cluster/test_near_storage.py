"""Near-storage preprocessing (SOPHON): fetchers on a storage node of the session's cluster
run a per-sample prefix; the training side runs the rest."""

from __future__ import annotations

import copy
import fcntl
import functools
import os
import threading
from collections import Counter

import numpy as np
import psutil
import pytest
import torch

import headrace as hr
from headrace.workloads import storage_images as si
from tests.helpers import ident_collate, wait_at_gate
from tests.ray_cluster.conftest import STORAGE_CPUS, add_storage_node
from tests.ray_cluster.test_remote import wait_until

pytestmark = pytest.mark.ray

N = 48
SCALE = 0.12  # long sides ~120 px, crop 26 px: a few ms per sample


def images() -> si.StorageImages:
    return si.openimages_like(N, scale=SCALE, seed=3)


def run_epochs(options: hr.Options, epochs: int = 2) -> tuple[list[dict[int, dict]], object]:
    loader = hr.DataLoader(si.pipeline(images()), batch_size=4, shuffle=True, num_workers=1,
                           collate_fn=ident_collate, persistent_workers=True, options=options)
    out = []
    for e in range(epochs):
        it = iter(loader)
        if e == 0 and isinstance(options.remote, hr.NearStorage):
            # the storage workers (persistent) are placed before the epoch after this one
            wait_until(lambda: loader.remote.ready_workers() >= STORAGE_CPUS)
        out.append({s["i"]: s for b in it for s in b})
    return out, loader


def near(policy: str, **kw) -> hr.Options:
    return hr.Options(seed=7, remote=hr.NearStorage(policy=policy, **kw))


@pytest.fixture(scope="module")
def plain_epochs():
    """Two epochs without near storage (the reference of the three policies below), run
    once for the module; each test gets its own copy."""
    done: list = []

    def get() -> list[dict[int, dict]]:
        if not done:
            epochs, plain = run_epochs(hr.Options(seed=7))
            plain.close()
            done.append(epochs)
        return copy.deepcopy(done[0])

    return get


@pytest.mark.parametrize("policy", ["headrace", "resize-off", "all-off"])
def test_samples_equal_with_and_without_near_storage(storage_node, plain_epochs, no_actor_leaks,
                                                     policy):
    expected = plain_epochs()
    kw = {"resize_step": "crop"} if policy == "resize-off" else {}
    # a slow link (1 MB/s configured): the decision offloads every sample that shrinks
    got, loader = run_epochs(near(policy, bandwidth=1e6, **kw))
    side = loader.remote.near
    try:
        for e in range(2):
            assert sorted(got[e]) == list(range(N))
            for i, s in expected[e].items():
                r = got[e][i]["x"]
                assert torch.equal(r, s["x"]), (policy, e, i)
        assert len(side.epochs) == 2
        r = loader.remote
        if policy != "all-off":  # the storage side read them and handed them back
            assert side.epochs[1].handed_back > 0
            # counted apart: remote_samples (and explain's "finished remotely") counted them
            assert r.remote_samples == 0
            assert 0 < r.handed_back_remote <= sum(e.handed_back for e in side.epochs)
            assert "handed back at their own stop by storage nodes" in loader.explain()
        else:
            assert r.remote_samples > 0 and r.handed_back_remote == 0
        if policy == "headrace":
            plan = side.epochs[1].plan  # decided from epoch 0's profile, run in epoch 1
            stops = plan.stops
            assert 0 < plan.offloaded < N  # big images cropped there, small ones sent raw
            assert set(np.unique(stops)) <= {1, 3}
            prof = side.recorder.profile()
            shrinks = prof.sizes[:, 2] < prof.sizes[:, 0]
            assert ((stops == 1) | shrinks).all()  # never offloads one smallest raw
        text = loader.explain()
        assert "near storage (SOPHON)" in text and "measured" in text
    finally:
        loader.close()


def decode_gated(gate: str, held: str, x):
    """Decode, first waiting at the gate (``wait_at_gate``): the test holds it until its
    storage node is dead."""
    wait_at_gate(gate, held)
    return si.decode(x)


def test_storage_node_killed_mid_epoch_loses_nothing(storage_node, no_actor_leaks, tmp_path):
    # With nobody consuming, the in-flight bound fills and the storage workers finish what
    # they hold and idle, so a kill "while they work" often found them idle. Here samples
    # started from the gate on wait for it; one more batch is asked for in a thread (room for
    # new samples; the training side's own decodes wait too), the node dies once one of its
    # processes (not the training process or its local worker) holds a sample, and the gate
    # opens when those processes are gone.
    n = 80
    gate, held = tmp_path / "gate", tmp_path / "held"
    held.mkdir()
    imgs = si.openimages_like(n, scale=SCALE, seed=3)
    pipe = hr.Pipeline(imgs, [
        hr.step(functools.partial(decode_gated, str(gate), str(held)), name="decode",
                kind="decode"),
        hr.step(si.crop_to(imgs.crop), name="crop", random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, shuffle=True, num_workers=1,
                           collate_fn=ident_collate,
                           options=near("resize-off", resize_step="crop"))
    it = iter(loader)
    wait_until(lambda: loader.remote.ready_workers() >= STORAGE_CPUS)
    seen: Counter[int] = Counter()
    for _ in range(3):
        seen.update(s["i"] for s in next(it))
    pool = it.pool
    ours = {os.getpid()} | {w.process.pid for w in list(pool.workers.values())
                            if not w.external and w.process.pid is not None}
    lock = open(gate, "w")  # noqa: SIM115 - released after the kill, in the finally below
    fcntl.flock(lock, fcntl.LOCK_EX)
    taken: list[list] = []
    fetch = functools.partial(next, it)
    one_more = threading.Thread(target=lambda: taken.append(fetch()), daemon=True)
    one_more.start()
    victim = storage_node.storage_node
    try:
        wait_until(lambda: any(int(f) not in ours for f in os.listdir(held)))
        holders = [int(f) for f in os.listdir(held) if int(f) not in ours]
        storage_node.remove_node(victim, allow_graceful=False)  # SIGKILL raylet and workers
        # Its workers exit once they see their raylet gone, not at once: opened before, the
        # gate let them finish and answer their caller directly (lost == 0 in 2 of 5 runs)
        wait_until(lambda: not any(psutil.pid_exists(p) for p in holders))
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.unlink(gate)
        one_more.join(60)
        assert not one_more.is_alive() and len(taken) == 1
        seen.update(s["i"] for s in taken[0])
        seen.update(s["i"] for b in it for s in b)
        assert seen == Counter(range(n))  # every sample exactly once
        assert loader.remote.lost >= 1  # the node died holding samples, re-run locally
    finally:
        lock.close()
        storage_node.storage_node = add_storage_node(storage_node)
        del it
        loader.close()  # also when an assertion failed: no worker threads left for the next test


def test_near_storage_options_are_checked():
    with pytest.raises(ValueError, match="resize_step"):
        hr.NearStorage(policy="resize-off")
    with pytest.raises(ValueError, match="policy"):
        hr.NearStorage(policy="half")
    with pytest.raises(ValueError, match="read_source"):
        hr.NearStorage(read_source=False)
    assert hr.NearStorage().placed().resources == {"headrace_storage": 1.0}


def drain(it) -> tuple[set[int], list[hr.StepError]]:
    """Every sample of an epoch that goes on after errors, and the errors it raised."""
    got, errors = set(), []
    while True:
        try:
            b = next(it)
        except StopIteration:
            return got, errors
        except hr.StepError as e:
            errors.append(e)
            continue
        got.update(s["i"] for s in b)


def test_step_error_on_the_storage_side_names_sample_and_step(storage_node, no_actor_leaks):
    def check(s):
        if s["i"] == 7:
            raise ValueError("bad sample 7")
        return s

    imgs = images()
    pipe = hr.Pipeline(imgs, [hr.step(si.decode, name="decode"), hr.step(check, name="check"),
                              hr.step(si.crop_to(imgs.crop), name="crop", random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, shuffle=True, num_workers=1,
                           collate_fn=ident_collate, persistent_workers=True,
                           options=hr.Options(remote=hr.NearStorage(policy="all-off")))
    try:
        it = iter(loader)
        wait_until(lambda: loader.remote.ready_workers() >= STORAGE_CPUS)
        drain(it)
        before = loader.remote.remote_samples
        got, errors = drain(iter(loader))  # epoch 1: on the storage workers
        assert got == set(range(N)) - {7}
        assert loader.remote.remote_samples - before == N - 1  # all finished on storage
        assert [(e.index, e.step) for e in errors] == [(7, "check")]
        assert isinstance(errors[0], ValueError) and "bad sample 7" in str(errors[0])
    finally:
        loader.close()


def test_resume_mid_epoch_from_a_near_storage_run(storage_node, no_actor_leaks):
    expected, plain = run_epochs(hr.Options(seed=7))
    plain.close()
    loader = hr.DataLoader(si.pipeline(images()), batch_size=4, shuffle=True, num_workers=1,
                           collate_fn=ident_collate, persistent_workers=True,
                           options=near("resize-off", resize_step="crop"))
    it = iter(loader)
    # samples in flight are capped (2 batches per worker): most of the epoch waits for the
    # storage workers, which then serve it
    wait_until(lambda: loader.remote.ready_workers() >= STORAGE_CPUS)
    first = {s["i"]: s for _ in range(8) for s in next(it)}
    assert loader.remote.near._handed_back > 0
    state = loader.state_dict()
    del it
    loader.close()
    resumed = hr.DataLoader(si.pipeline(images()), batch_size=4, shuffle=True, num_workers=1,
                            collate_fn=ident_collate, options=hr.Options(seed=7))
    resumed.load_state_dict(state)
    rest = {s["i"]: s for b in resumed for s in b}
    assert sorted([*first, *rest]) == list(range(N)) and not set(first) & set(rest)
    for i, s in {**first, **rest}.items():
        assert torch.equal(s["x"], expected[0][i]["x"])
