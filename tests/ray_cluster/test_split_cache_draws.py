"""A remote worker's steps drew from a global generator before the split: the local workers
that finish the sample store no form after them.

Remote workers use no cache, but with a split the local workers store the forms after it
(docs/design.md, "Remote workers do not use the sample cache"). A step before the split that
is not declared random and draws from NumPy's global generator makes those forms differ each
epoch; the local part did not know the remote part drew, stored the decoded form, and a later
epoch's lookup served epoch 1's draw.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import headrace as hr
from tests.helpers import ident_collate
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_ready

pytestmark = pytest.mark.ray

N = 32


class Src:
    def __len__(self) -> int:
        return N

    def load(self, i: int) -> dict:
        return {"i": i, "x": np.zeros(4, np.float32)}


def draws(d: dict) -> dict:
    """Not declared random: draws from NumPy's global generator (before the split)."""
    info = torch.utils.data.get_worker_info()
    return {**d, "x": d["x"] + np.float32(np.random.random()),
            "remote": info is not None and info.id >= 1}


def heavy(d: dict) -> dict:
    """Deterministic, after the split: its output is the decoded form, worth storing."""
    time.sleep(0.01)  # simulated work
    return {**d, "x": d["x"] * 2}


def flip(d: dict, rng: np.random.Generator) -> dict:
    return {**d, "x": d["x"] + np.float32(rng.random())}


def _pipe() -> hr.Pipeline:
    return hr.Pipeline(Src(), [hr.step(draws), hr.step(heavy), hr.step(flip, random=True)])


def _reference() -> list[dict[int, np.ndarray]]:
    loader = hr.DataLoader(_pipe(), batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=3, cache=None, handoff=False))
    try:
        return [{s["i"]: s["x"] for b in loader for s in b} for _ in range(2)]
    finally:
        loader.close()


@pytest.mark.timeout(240)
def test_a_draw_before_the_split_keeps_the_forms_after_it_out_of_the_cache(ray_cluster,
                                                                          no_actor_leaks):
    ref = _reference()
    loader = hr.DataLoader(_pipe(), batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=3, handoff=False,
                                              cache=hr.Cache(budget_bytes=16 << 20),
                                              remote=hr.Remote(max_workers=2,
                                                               resources=ON_CPU_NODES)))
    loader.remote.stop, loader.remote.ratio = 2, 1.0  # remote: load and draws; local: the rest
    it = iter(loader)
    try:
        wait_ready(it, 2)
        first = {s["i"]: s for b in it for s in b}
        assert sum(s["remote"] for s in first.values()) > 0  # some drew remotely
        # the next epoch runs locally: every sample is looked up
        loader.remote.ratio, loader.remote.target = 0.0, 0
        second = {s["i"]: s for b in loader for s in b}
        for e, got in enumerate((first, second)):
            assert sorted(got) == list(range(N))
            for i, s in got.items():
                np.testing.assert_array_equal(s["x"], ref[e][i], err_msg=f"epoch {e + 1}, {i}")
        assert loader.stats().last.cache.hits_by_tier.get("decoded", 0) == 0
    finally:
        del it
        loader.close()
