"""Whatever a sampler yields reaches ``__getitem__`` unchanged, as with torch's DataLoader:
NumPy's and torch's integers (``SubsetRandomSampler(np.where(mask)[0])``), string keys, tuples
(a multi-scale batch sampler), negative indices, lists of indices fetched at once (torch's
``batch_size=None, sampler=BatchSampler(...)``). Each gets its own seed (docs/design.md)."""

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import headrace as hr

pytestmark = pytest.mark.integration


class Keyed(tud.Dataset):
    """Returns what it was given, as plain data, and a draw from the global generator."""

    def __len__(self):
        return 10

    def __getitem__(self, key):
        if isinstance(key, str):
            value = [ord(c) for c in key]
        elif isinstance(key, (tuple, list)):
            value = [int(k) for k in key]
        else:
            value = [int(key)]
        return {"key": value, "draw": torch.rand(1)}


def _run(loader_cls, workers, **kw):
    loader = loader_cls(Keyed(), num_workers=workers, **kw)
    try:
        got = []
        for b in loader:
            keys = b["key"]  # batched: a tensor per position of the lists; batch_size=None: a list
            if isinstance(keys, torch.Tensor):
                keys = keys.tolist()
            elif keys and isinstance(keys[0], torch.Tensor):
                keys = torch.stack(keys, 1).tolist()
            got.append(keys)
        return got
    finally:
        getattr(loader, "close", lambda: None)()


class Scales:
    """A batch sampler of (index, size) keys, as multi-scale training samples them."""

    def __iter__(self):
        yield [(0, 2), (1, 2)]
        yield [(2, 3), (3, 3)]

    def __len__(self):
        return 2


CASES = {
    "numpy integers": dict(sampler=list(np.arange(0, 10, 2)), batch_size=5),
    "torch integers": dict(sampler=list(torch.arange(0, 10, 2)), batch_size=5),
    "string keys": dict(sampler=["ab", "cd"], batch_size=2),
    "tuple keys": dict(batch_sampler=Scales()),
    "negative indices": dict(sampler=[-1, -2], batch_size=2),
    "lists of indices": dict(sampler=tud.BatchSampler(range(10), 4, False), batch_size=None),
}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_a_sampler_key_reaches_getitem_as_with_torch(case, workers, no_leaks):
    kw = CASES[case]
    want = _run(tud.DataLoader, workers, **kw)
    assert _run(hr.DataLoader, workers, **kw) == want


def test_keys_that_are_not_integers_draw_differently_and_repeatably(no_leaks):
    def draws(seed):
        loader = hr.DataLoader(Keyed(), batch_size=None, num_workers=2,
                               sampler=["a", "b", (1, 2), -3, [4, 5], 6],
                               options=hr.Options(seed=seed, profile_store=False))
        try:
            return [float(s["draw"]) for s in loader]
        finally:
            loader.close()

    first = draws(1)
    assert len(set(first)) == 6  # each key its own stream
    assert draws(1) == first  # per-sample seeding: the same keys, the same draws
    assert draws(2) != first


class Wrapping:
    """A source whose ``load`` takes any integer, negative ones as a list does."""

    def __len__(self):
        return 24

    def load(self, i):
        return np.full(8, int(i) % 24, dtype=np.uint8).tobytes()


def widen(raw):
    return np.frombuffer(raw, dtype=np.uint8).astype(np.float32)


def jitter(x, rng):
    return torch.from_numpy(x + rng.random(x.shape, dtype=np.float32))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("keys", [list(np.arange(0, 24)), list(range(-1, -25, -1))],
                         ids=["numpy integers", "negative indices"])
def test_the_sample_cache_keys_any_sampler_key(keys, workers, no_leaks):
    # the cache's key was the index's 8 bytes (an int's to_bytes): NumPy's integers and
    # negative indices raised there, outside the step, and killed the worker
    pipe = hr.Pipeline(Wrapping(), [hr.step(widen, kind="decode"),
                                    hr.step(jitter, random=True)])
    loader = hr.DataLoader(pipe, batch_size=8, sampler=keys, num_workers=workers,
                           options=hr.Options(seed=7, cache=hr.Cache(), profile_store=False))
    try:
        for _ in range(2):
            assert sum(len(b) for b in loader) == len(keys)
        # the second epoch finds what the first stored under each key. Whether a form is
        # worth storing, and a lookup worth making, is decided from timings (these steps cost
        # about as much as a lookup), so a lookup made can miss only a form the first epoch
        # chose not to store; it never misses one stored under its key
        first, second = (e.cache for e in loader.stats().epochs[-2:])
        assert first.errors == second.errors == 0 and second.bytes_by_tier["decoded"] > 0
        assert first.inserts + first.not_stored == second.lookups == len(keys)
        assert 0 <= second.lookups - second.hits - second.not_worth <= first.not_stored
    finally:
        loader.close()
