"""Persistent workers and the cache's per-epoch plan (``cache/epoch_client.py``): the keys
and the split each epoch chose reach workers that outlive an epoch."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import torch

import headrace as hr

pytestmark = pytest.mark.integration
N = 32
SCALE = 1.0
"""A module global the step reads (its value counts in the step's key)."""


class Offset:
    """``load(i)``: the index plus ``offset``, an attribute the script changes between epochs."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> np.ndarray:
        return np.full((4,), float(i) + self.offset, np.float32)


def scaled(x: np.ndarray) -> np.ndarray:
    time.sleep(0.002)  # simulated work: a form is stored when its steps cost more than a copy
    return x * SCALE


def _epochs(cache, executor: str, change: str, workers: int = 2) -> list[list[float]]:
    """Three epochs of ``workers`` persistent workers; ``change`` (the dataset's attribute or
    the step's global) changed before the third. Each epoch's values, sorted."""
    global SCALE
    SCALE = 1.0
    src = Offset()
    loader = hr.DataLoader(hr.Pipeline(src, [hr.step(scaled)]), batch_size=8,
                           num_workers=workers, persistent_workers=True, timeout=60,
                           options=hr.Options(seed=2, profile_store=False, cache=cache,
                                              executor=executor))
    out = []
    try:
        for e in range(3):
            if e == 2 and change == "dataset":
                src.offset = 1000.0
            elif e == 2:
                SCALE = 10.0
            out.append(sorted(float(v) for b in loader for v in b.flatten()))
        return out
    finally:
        SCALE = 1.0
        loader.close()


@pytest.mark.parametrize("change", ["dataset", "global"])
def test_worker_threads_take_each_epochs_keys(change, no_leaks) -> None:
    """Worker threads run the training process's dataset and globals: a change the script makes
    between epochs is what they compute with, and the cache keys it anew. Persistent ones kept
    the first epoch's keys and served its forms (a bug hunt: 32 stale hits of 32)."""
    want = _epochs(None, "threads", change)
    assert want[2] != want[1]  # the change shows without the cache
    assert _epochs(hr.Cache(budget_bytes=1 << 20), "threads", change) == want


class CrashOnce:
    """A random step that ends its worker process once a trigger file exists (it removes it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return x
        os._exit(1)


def _restarted(cache, trigger: str) -> list[list[float]]:
    src = Offset()
    pipe = hr.Pipeline(src, [hr.step(scaled), hr.step(CrashOnce(trigger), random=True,
                                                      name="crash")])
    loader = hr.DataLoader(pipe, batch_size=8, num_workers=1, persistent_workers=True,
                           timeout=60, options=hr.Options(seed=2, profile_store=False,
                                                          cache=cache))
    out = []
    try:
        for e in range(3):
            if e == 1:
                src.offset = 1000.0
                open(trigger, "w").close()
            out.append(sorted(float(v) for b in loader for v in b[:, 0]))
        return out
    finally:
        loader.close()


def test_a_replacement_worker_process_keys_by_the_state_it_started_with(tmp_path,
                                                                       no_leaks) -> None:
    """A persistent worker process keeps the dataset it started with (as torch's), so its keys
    stay its start's; one forked later (here a replacement for a crashed one) runs the training
    process's dataset as it is then, and was given the first epoch's keys: it was served the
    old dataset's forms where it computes the new one's."""
    want = _restarted(None, str(tmp_path / "a"))
    assert want[1] == want[2] != want[0]  # the replacement runs the changed dataset
    assert _restarted(hr.Cache(budget_bytes=1 << 20), str(tmp_path / "b")) == want


class Slow:
    """A slow source of small samples: caching their encoded form saves the read."""

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> np.ndarray:
        time.sleep(0.004)  # simulates a storage read
        return np.full((16,), i, np.float32)


def inflate(x: np.ndarray) -> np.ndarray:
    return np.repeat(x, 4096)  # 64 B to 256 KiB: 8 decoded forms fill the budget


def jitter(x: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    return torch.from_numpy(x + np.float32(rng.random()))


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_persistent_workers_follow_a_later_split(executor, no_leaks) -> None:
    """The first epoch gives the budget to the decoded form (no profile yet: 8 of 32 fit);
    MDP then gives the encoded one a share where all fit. Persistent workers kept the first
    plan: they never stored an encoded form, and the samples without a decoded one never hit
    (a split all to the encoded form: 0 hits of 64 in every later epoch)."""
    pipe = hr.Pipeline(Slow(), [hr.step(inflate), hr.step(jitter, random=True)])
    loader = hr.DataLoader(pipe, batch_size=8, num_workers=2, persistent_workers=True,
                           timeout=60, options=hr.Options(
                               seed=1, profile_store=False, executor=executor,
                               cache=hr.Cache(budget_bytes=2 << 20)))
    try:
        for _ in range(3):
            assert sum(len(b) for b in loader) == N
        first, _, last = caches = [e.cache for e in loader.stats().epochs]
        assert first.budget_by_tier["decoded"] > 0 and first.budget_by_tier["encoded"] == 0
        assert last.budget_by_tier["encoded"] > 0, caches  # MDP's split
        assert last.hits_by_tier["encoded"] > 0, caches
    finally:
        loader.close()


@pytest.mark.redis
def test_persistent_worker_processes_take_a_later_split_on_redis(redis_server, no_leaks) -> None:
    """A Redis backend keeps its tier budgets per process: persistent worker processes kept
    the first epoch's and refused every encoded form as over its budget (0)."""
    redis_server.flush()
    pipe = hr.Pipeline(Slow(), [hr.step(inflate), hr.step(jitter, random=True)])
    loader = hr.DataLoader(pipe, batch_size=8, num_workers=2, persistent_workers=True,
                           timeout=60, options=hr.Options(
                               seed=1, profile_store=False,
                               cache=hr.Cache(url=redis_server.url, budget_bytes=2 << 20)))
    try:
        for _ in range(3):
            assert sum(len(b) for b in loader) == N
        first, _, last = caches = [e.cache for e in loader.stats().epochs]
        assert first.budget_by_tier["encoded"] == 0
        assert last.budget_by_tier["encoded"] > 0, caches  # MDP's split
        assert last.hits_by_tier["encoded"] > 0, caches
    finally:
        loader.close()
