"""The default cache and a module setting the training script changes between epochs (a
curriculum), read by a deterministic step through a helper or a callable class's method: the
step's identity counted the helper's code only (the method's globals by name), and the cache
served the first epoch's samples, computed with the old setting (a bug hunt)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import headrace as hr

pytestmark = pytest.mark.integration
N = 4
SCALE = 1
"""The setting: 1 in the first epoch, 3 after."""


def helper(x: np.ndarray) -> np.ndarray:
    return x * SCALE


def prep(x: np.ndarray) -> np.ndarray:
    return helper(x)


class Prep:
    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x * SCALE


class Src:
    def __len__(self) -> int:
        return N

    def load(self, i: int) -> np.ndarray:
        return np.full(4, i, np.float32)


@pytest.mark.parametrize("fn", [prep, Prep()], ids=["helper", "method"])
def test_a_setting_changed_between_epochs_is_not_served_from_the_old_settings_entries(
        fn, monkeypatch, no_leaks):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "SCALE", 1)
    loader = hr.DataLoader(hr.Pipeline(Src(), [hr.step(fn)]), batch_size=2, num_workers=0,
                           options=hr.Options(seed=0, profile_store=False,
                                              cache=hr.Cache(budget_bytes=1 << 20)))
    firsts = []
    try:
        for scale in (1, 3, 3):
            monkeypatch.setattr(module, "SCALE", scale)
            firsts.append(sorted(float(v) for b in loader for v in b[:, 0]))
        hits = [e.cache.hits for e in loader.stats().epochs]
    finally:
        loader.close()
    assert firsts == [[float(i) for i in range(N)]] + [[3.0 * i for i in range(N)]] * 2
    assert hits == [0, 0, N]  # the new setting's entries are stored, then used
