"""The default cache and a step's own state: parameters nested deep in it (a ``Compose`` inside
the step object, a ``partial``'s argument, a nested ``nn.Sequential``), and a random generator
of its own. State nested more than 6 levels deep was not in the cache key, so a size or weights
the script changed between epochs were served from the old ones' entries; a step drawing from
its own generator was cached as deterministic, its first epoch's draws served every epoch (a
bug hunt)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import headrace as hr
from tests.helpers import cpu_work

pytestmark = pytest.mark.integration
N = 8



class Resize:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x[: self.size]


class Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for t in self.transforms:
            x = t(x)
        return x


class Prep:
    """A step object holding a torchvision-like ``Compose([Resize(size)])``."""

    def __init__(self, size: int) -> None:
        self.t = Compose([Resize(size)])

    def __call__(self, x: np.ndarray) -> np.ndarray:
        cpu_work()
        return self.t(x)


def apply(x: np.ndarray, t: Compose) -> np.ndarray:
    return t(x)


class Jitter:
    """Not declared random: draws from a generator it holds."""

    def __init__(self) -> None:
        self.g = np.random.default_rng(0)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        cpu_work()
        return x + np.float32(self.g.random())


class Src:
    def __len__(self) -> int:
        return N

    def load(self, i: int) -> np.ndarray:
        return np.full((16, 2), i, np.float32)


def _loader(steps: list, workers: int = 0, persistent: bool = False) -> hr.DataLoader:
    return hr.DataLoader(hr.Pipeline(Src(), steps), batch_size=4, num_workers=workers,
                         persistent_workers=persistent,
                         options=hr.Options(seed=0, profile_store=False,
                                            cache=hr.Cache(budget_bytes=1 << 20)))


def _resize_in(step, size: int) -> None:
    """Set the size of the ``Resize`` nested in ``step`` (as a script's curriculum would)."""
    t = step.t if isinstance(step, Prep) else step.keywords["t"]
    t.transforms[0].size = size


@pytest.mark.parametrize("make", [Prep, lambda s: functools.partial(apply, t=Compose([Resize(s)]))],
                         ids=["object", "partial"])
def test_a_size_nested_deep_in_a_step_changed_between_epochs_is_not_served_from_old_entries(
        make, no_leaks):
    step = make(12)
    loader = _loader([hr.step(step, name="prep")])
    rows = []
    try:
        for size in (12, 6, 6):
            _resize_in(step, size)
            rows.append({tuple(b.shape[1:]) for b in loader})
        hits = [e.cache.hits for e in loader.stats().epochs]
    finally:
        loader.close()
    assert rows == [{(12, 2)}, {(6, 2)}, {(6, 2)}]
    assert hits[:2] == [0, 0] and hits[2] > 0  # the new size's entries are stored, then used


def test_weights_of_a_nested_module_changed_between_epochs_are_not_served_from_old_entries(
        no_leaks):
    torch.manual_seed(0)
    enc = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2)), torch.nn.ReLU())

    class Features:
        def __init__(self) -> None:
            self.enc = enc

        @torch.no_grad()
        def __call__(self, x: np.ndarray) -> torch.Tensor:
            return self.enc(torch.from_numpy(x))

    loader = _loader([hr.step(Features(), name="features")])
    try:
        first = torch.cat(list(loader))
        with torch.no_grad():
            for p in enc.parameters():
                p.mul_(-1.0)  # another checkpoint
        second = torch.cat(list(loader))
        with torch.no_grad():
            want = enc(torch.stack([torch.from_numpy(Src().load(i)) for i in range(N)]))
    finally:
        loader.close()
    assert not torch.equal(first, second)
    assert torch.equal(second, want)


@pytest.mark.parametrize(("workers", "persistent"), [(0, False), (2, True)])
def test_a_step_drawing_from_its_own_generator_is_not_served_its_first_epochs_draws(
        workers, persistent, no_leaks):
    def sums(loader) -> list[float]:
        try:
            return [float(torch.cat(list(loader)).sum()) for _ in range(3)]
        finally:
            loader.close()

    cached = _loader([hr.step(Jitter(), name="jitter")], workers, persistent)
    got = sums(cached)
    explained = cached.explain()
    assert len(set(got)) == 3  # each epoch draws anew (the first epoch's were served after)
    assert "step 'jitter' holds a random generator" in explained
    if workers == 0:  # one process draws them in order: exactly the uncached loader's
        plain = hr.DataLoader(hr.Pipeline(Src(), [hr.step(Jitter(), name="jitter")]),
                              batch_size=4, num_workers=0,
                              options=hr.Options(seed=0, profile_store=False, cache=None))
        assert got == sums(plain)


@pytest.mark.redis
def test_two_jobs_on_one_redis_whose_steps_differ_deep_down_share_no_entries(redis_server,
                                                                              no_leaks):
    # job B (size 6) was served job A's (size 12) samples: every hit, every batch 12 rows
    redis_server.flush()

    def job(size: int) -> tuple[set, int]:
        loader = hr.DataLoader(
            hr.Pipeline(Src(), [hr.step(Prep(size), name="prep")]), batch_size=4,
            num_workers=0, options=hr.Options(seed=0, profile_store=False, cache=hr.Cache(
                url=redis_server.url, budget_bytes=1 << 20, split={"decoded": 1.0})))
        try:
            rows = [{tuple(b.shape[1:]) for b in loader} for _ in range(2)]
            return rows[0] | rows[1], loader.stats().epochs[0].cache.inserts
        finally:
            loader.close()

    assert job(12) == ({(12, 2)}, N)  # all its samples stored
    assert job(6)[0] == {(6, 2)}  # its first lookups are tried before any is judged dearer
