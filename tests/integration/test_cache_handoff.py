"""A sample that drew from a global generator before its hand-off: the cache stores no form
after that draw in the part that finishes it.

A step not declared ``random=True`` that draws from NumPy's global generator makes every form
after it differ from epoch to epoch; the inserter refuses them (``Insert.drew``). A hand-off
splits the sample into two runs, in two workers (slow lane) or one (kept: its value would not
travel as it is); the second run's inserter did not know the first one drew, stored the
decoded form, and later epochs were served epoch 1's draw (a cache hunt: exactly the handed-off
samples differed from ``cache=None``). Worker processes re-seed the global generators per
(sample, step), so ``cache=None`` is the exact reference.
"""

import time

import numpy as np
import pytest

import headrace as hr

pytestmark = pytest.mark.integration

N = 16
FORCED = hr.TimeoutConfig(fixed_s=0.005)  # every sample over it after its first step


class Src:
    kept = False
    """True: the sample's value holds one array twice, which a hand-off would not deliver
    as it is (``runtime/faithful.py``), so its worker finishes it (two cached runs there)."""

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> dict:
        return _alias({"i": i, "kept": self.kept}, np.zeros(4, np.float32))


class KeptSrc(Src):
    kept = True


def _alias(d: dict, x: np.ndarray) -> dict:
    return {"i": d["i"], "x": x, "alias": x if d["kept"] else x.copy(), "kept": d["kept"]}


def jitter(d: dict) -> dict:
    """Not declared random: draws from NumPy's global generator."""
    time.sleep(0.01)  # simulated work, over the timeout: handed off after this step
    return _alias(d, d["x"] + np.float32(np.random.random()))


def heavy(d: dict) -> dict:
    """Deterministic: its output is the decoded form, worth storing."""
    time.sleep(0.02)  # simulated work: enough left for a hand-off to pay
    return _alias(d, d["x"] * 2)


def flip(d: dict, rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([[d["i"]], d["x"] + np.float32(rng.random())])


def _epochs(source: Src, cache: hr.Cache | None):
    opts = hr.Options(seed=5, cache=cache, timeout=FORCED, profile_store=False)
    pipe = hr.Pipeline(source, [hr.step(jitter), hr.step(heavy), hr.step(flip, random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, options=opts)
    try:
        out = []
        for _ in range(3):
            rows = np.concatenate([b.numpy() for b in loader])
            out.append(rows[np.argsort(rows[:, 0])])
        return out, loader.stats().epochs
    finally:
        loader.close()


@pytest.mark.parametrize("source", [Src, KeptSrc], ids=["slow lane", "kept"])
def test_a_sample_that_drew_before_its_hand_off_is_never_frozen_by_the_cache(source, no_leaks):
    ref, _ = _epochs(source(), None)
    got, stats = _epochs(source(), hr.Cache(budget_bytes=1 << 20))
    if source is Src:
        assert all(e.slow_samples > 0 for e in stats)  # handed off to the slow lane
    else:
        assert all(e.slow_samples == 0 for e in stats)  # kept: finished by its own worker
    for e in range(3):
        np.testing.assert_array_equal(got[e], ref[e], err_msg=f"epoch {e + 1}")
    assert not np.array_equal(ref[0], ref[1])  # the draws differ per epoch
    for e in stats:
        assert e.cache.hits_by_tier.get("decoded", 0) == 0
        assert e.cache.drew > 0
