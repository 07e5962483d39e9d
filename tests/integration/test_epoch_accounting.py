"""What ``stats()`` and ``explain()`` say about an epoch holds: its clock starts at ``iter()``,
an epoch left part-way is not "running"."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from torch.utils.data import Sampler

import headrace as hr
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration
N = 32
ITER_S = 0.3


class SlowStartSampler(Sampler[int]):
    """Its ``__iter__`` takes ``ITER_S`` before the first index (simulated work: a sampler
    that reads an index file or shuffles a large dataset); read inside ``iter(loader)``."""

    def __len__(self) -> int:
        return N

    def __iter__(self) -> Iterator[int]:
        time.sleep(ITER_S)  # simulated work (an index file read, a large shuffle)
        return iter(range(N))


def test_the_epoch_clock_starts_at_iter(no_leaks) -> None:
    """``wall_s`` is "from iter(loader)": the time inside ``iter()`` (here the sampler's first
    read, with workers forking) counts, as the loop's wait (``stall_s``), so ``wall_s -
    stall_s`` (the loop's own time) does not grow."""
    loader = hr.DataLoader(IndexDataset(N), batch_size=8, sampler=SlowStartSampler(),
                           num_workers=2, options=hr.Options(profile_store=False))
    try:
        for _ in loader:
            pass
        e = loader.stats().last
    finally:
        loader.close()
    assert e is not None and e.samples == N
    assert e.wall_s >= ITER_S and e.stall_s >= ITER_S


def test_an_epoch_the_loop_broke_out_of_is_not_running(no_leaks) -> None:
    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=2,
                           options=hr.Options(profile_store=False))
    try:
        for k, _ in enumerate(loader):
            if k == 0:
                during = loader.explain().splitlines()[-1]
            if k == 2:
                break  # the iterator is dropped: the epoch is over, part-way
        after = loader.explain().splitlines()[-1]
    finally:
        loader.close()
    assert during.endswith("(running)")
    assert after.startswith("epoch 0: 12 samples")
    assert after.endswith("(left part-way, after 3 batches)")


def test_before_any_epoch_the_profile_is_not_said_measured() -> None:
    loader = hr.DataLoader(IndexDataset(N), batch_size=8)
    before = loader.explain()
    for _ in loader:
        pass
    after = loader.explain()
    assert "profile: not measured yet (no epoch started); to be kept in" in before
    assert "profile: measured this run; kept in" in after
