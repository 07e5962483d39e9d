"""The cache checks some hits against what their steps compute (``cache/verify.py``).

A step or a source drawing from a generator headrace cannot see (another module's, one it makes
itself, a source's module global) had its first epoch's output served in every later epoch:
the same value each epoch where torch and ``cache=None`` drew anew (a cache review: 5 of 14
placements, hits [0, 8, 8]; ``explain()`` said nothing). A checked hit now computes its form
too; a form that differs is not served again, and ``explain()`` names the step and the fix."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.cache import client as cache_client
from tests.helpers import cpu_work
from tests.integration import hidden_rng

pytestmark = pytest.mark.integration
N = 8



class Src:
    def __len__(self) -> int:
        return N

    def load(self, i: int) -> np.ndarray:
        return np.full((16, 2), i, np.float32)


SRC_RNG = [np.random.default_rng()]  # a stream of its own in each process (``hidden_rng``)
os.register_at_fork(after_in_child=lambda: SRC_RNG.__setitem__(0, np.random.default_rng()))


class SrcModuleGlobal(Src):
    def load(self, i: int) -> np.ndarray:
        return np.full((16, 2), i, np.float32) + np.float32(SRC_RNG[0].random())


class SrcOtherModule(Src):
    def load(self, i: int) -> np.ndarray:
        return np.full((16, 2), i, np.float32) + np.float32(hidden_rng.RNG.random())


def via_other_module(x: np.ndarray) -> np.ndarray:
    cpu_work()
    return hidden_rng.jitter(x)


def fresh_numpy(x: np.ndarray) -> np.ndarray:
    cpu_work()
    return x + np.float32(np.random.default_rng().random())


def fresh_torch(x: np.ndarray) -> np.ndarray:
    cpu_work()
    g = torch.Generator()
    g.seed()
    return x + np.float32(torch.rand(1, generator=g).item())


def ident(x: np.ndarray) -> np.ndarray:
    cpu_work()
    return x * 1


CASES = {  # source, step, what explain() names
    "helper drawing from its module's generator": (Src, via_other_module, "step 's'"),
    "unseeded np.random.default_rng() in the step": (Src, fresh_numpy, "step 's'"),
    "torch.Generator().seed() in the step": (Src, fresh_torch, "step 's'"),
    "load drawing from its module's generator": (SrcModuleGlobal, ident, "the source's load"),
    "load drawing from another module's generator": (SrcOtherModule, ident, "the source's load"),
}


def _loader(src: type, step, workers: int, executor: str,
            persistent: bool = True) -> hr.DataLoader:
    return hr.DataLoader(hr.Pipeline(src(), [hr.step(step, name="s")]), batch_size=4,
                         num_workers=workers, persistent_workers=persistent and workers > 0,
                         options=hr.Options(seed=0, profile_store=False, executor=executor,
                                            cache=hr.Cache(budget_bytes=1 << 20)))


def _epoch(loader: hr.DataLoader) -> dict[int, float]:
    """Each sample's value (index + its draw, in [index, index + 1)), by index."""
    values = torch.cat(list(loader))[:, 0, 0].tolist()
    return {int(v): v for v in values}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(("workers", "executor", "persistent"),
                         [(0, "processes", False), (2, "processes", True),
                          (2, "processes", False), (2, "threads", True)])
def test_a_hidden_generator_is_never_served_its_first_epochs_draws(no_leaks, case, workers,
                                                                   executor, persistent,
                                                                   monkeypatch) -> None:
    # every store and lookup made: the cache's cost rule (not what this tests) may skip them
    # on a loaded machine, and a form never looked up is never checked (a full run: the
    # threads case with differed == 0). Workers fork after this.
    monkeypatch.setattr(cache_client, "PROBE_EVERY", 1)
    src, step, culprit = CASES[case]
    loader = _loader(src, step, workers, executor, persistent)
    try:
        epochs = [_epoch(loader) for _ in range(3)]
        totals = loader.cache.counters.totals()
        text = loader.explain()
    finally:
        loader.close()
    assert all(sorted(e) == list(range(N)) for e in epochs)
    # every epoch draws anew, as with torch and cache=None: no sample has epoch 1's value
    for later in epochs[1:]:
        assert all(later[i] != epochs[0][i] for i in range(N)), (epochs, text)
    assert totals["differed"] >= 1
    assert "decoded form (after step 's') differed from what its steps compute" in text
    assert f"{culprit} gives another output for the same input" in text
    assert "random=True" in text


def test_a_form_found_to_differ_is_warned_about_once_and_no_longer_looked_up(no_leaks, caplog):
    loader = _loader(Src, via_other_module, 0, "processes")
    try:
        with caplog.at_level(logging.WARNING, logger="headrace"):
            for _ in range(3):
                _epoch(loader)
        hits = [e.cache.hits for e in loader.stats().epochs]
    finally:
        loader.close()
    warned = [r for r in caplog.records if "differed from what its steps compute" in r.message]
    assert len(warned) == 1 and "step 's'" in warned[0].message
    assert hits == [0, 1, 0]  # the checked hit, computed; then the form is off


def test_a_deterministic_form_is_verified_and_still_served(no_leaks) -> None:
    loader = _loader(Src, ident, 0, "processes")
    try:
        epochs = [_epoch(loader) for _ in range(3)]
        hits = [e.cache.hits for e in loader.stats().epochs]
        totals = loader.cache.counters.totals()
        text = loader.explain()
    finally:
        loader.close()
    assert epochs[0] == epochs[1] == epochs[2]
    assert hits == [0, N, N]
    # epoch 2: two checks while unverified (CHECKS_UNVERIFIED), epoch 3: one (CHECKS_VERIFIED)
    assert (totals["checked"], totals["differed"]) == (3, 0)
    assert "verified: decoded" in text and "differed from" not in text


KEY_ORDER = "HEADRACE_TEST_KEY_ORDER"
"""The environment variable ``split`` builds its dict's key order from (workers inherit it)."""
PARTS = ("image", "mask", "depth", "boxes", "labels")


def split(x: np.ndarray) -> dict[str, np.ndarray]:
    """A deterministic step whose dict's key order follows the process, as one built from a set
    of strings does (each process has its own string-hash seed: spawned workers, a restarted
    job, two jobs sharing one Redis): equal values, other encodings. Four times the usual
    simulated work: its threads case, on a loaded machine, once found lookups dearer than a
    0.3 ms step and looked none up (0 hits in an epoch: the cache's cost rule, not a defect;
    counted in ``not_worth``)."""
    cpu_work(16)
    keys = sorted(PARTS, reverse=os.environ.get(KEY_ORDER) == "reversed")
    return {k: x * len(k) for k in keys}


@pytest.mark.parametrize(("workers", "executor", "persistent", "context"),
                         [(0, "processes", False, None), (2, "processes", False, None),
                          (2, "threads", True, None), (2, "processes", False, "spawn")])
def test_a_dict_in_another_key_order_is_the_same_value(no_leaks, monkeypatch, workers,
                                                       executor, persistent, context) -> None:
    # each epoch's processes build the dicts in another key order than the epoch before
    loader = hr.DataLoader(hr.Pipeline(Src(), [hr.step(split, name="split")]), batch_size=4,
                           num_workers=workers, persistent_workers=persistent,
                           multiprocessing_context=context,
                           options=hr.Options(seed=0, profile_store=False, executor=executor,
                                              cache=hr.Cache(budget_bytes=1 << 22)))
    try:
        epochs = []
        for order in ("sorted", "reversed", "sorted")[:2 if context else 3]:
            monkeypatch.setenv(KEY_ORDER, order)
            batches = list(loader)
            epochs.append({k: torch.cat([b[k] for b in batches]) for k in PARTS})
        caches = [e.cache for e in loader.stats().epochs]
        totals = loader.cache.counters.totals()
        text = loader.explain()
    finally:
        loader.close()
    for e in epochs[1:]:
        assert all(torch.equal(e[k], epochs[0][k]) for k in PARTS)
    assert totals["checked"] >= 2 and totals["differed"] == 0, text
    # served in every later epoch: each sample a hit, or a lookup the cache's cost rule skipped
    # (threads on a loaded machine measured lookups dearer than this step: hits [0, 2, 8]; a
    # form turned off is neither), and some hits
    counts = [(c.hits, c.not_worth) for c in caches]
    assert all(h + skipped == N for h, skipped in counts[1:]), (counts, text)
    assert sum(h for h, _ in counts[1:]) >= totals["checked"] >= 2, (counts, text)
    assert "verified: decoded" in text and "differed from" not in text


def boxes(x: np.ndarray) -> dict[str, object]:
    """Differs from run to run in one element of one array only: ``['boxes'][3]``."""
    cpu_work()
    return {"label": int(x[0, 0]), "boxes": [x[0], x[1], x[2], x[3] + np.float32(hidden_rng.RNG.random())]}


def test_the_warning_says_where_the_values_differ(no_leaks, caplog) -> None:
    loader = hr.DataLoader(hr.Pipeline(Src(), [hr.step(boxes, name="s")]), batch_size=4,
                           options=hr.Options(seed=0, profile_store=False,
                                              cache=hr.Cache(budget_bytes=1 << 20)))
    try:
        with caplog.at_level(logging.WARNING, logger="headrace"):
            for _ in range(2):
                list(loader)
        text = loader.explain()
    finally:
        loader.close()
    warned = [r.message for r in caplog.records if "differed from what its steps" in r.message]
    where = "(value['boxes'][3]: 2 of 2 elements differ (float32, shape (2,)))"
    assert len(warned) == 1 and where in warned[0], warned
    assert where in text and "step 's' gives another output" in text
