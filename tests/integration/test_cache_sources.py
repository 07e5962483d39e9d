"""Which cache entries a source gets: two sources of one class and length have their own, a
source the script changes between epochs is not served its old entries, one that opens a
handle on first use reuses its entries after that (``cache/tiers.py``'s source fingerprint)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.cache.tiers import TierLayout

pytestmark = pytest.mark.integration


class Rooted:
    """A source of one class and length whatever its root, which opens a handle on first use."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.handle: object | None = None

    def __len__(self) -> int:
        return 4

    def load(self, i: int) -> str:
        if self.handle is None:
            self.handle = object()  # state the source changes as it runs
        return f"{self.root}/{i}"


def test_sources_of_one_class_and_length_have_their_own_entries(no_leaks) -> None:
    # two jobs over Rooted("/a") and Rooted("/b") shared a cache's namespaces (class and length
    # were the source's whole identity): through Redis one was served the other's samples
    def layout(root: str) -> tuple[str, ...]:
        return tuple(t.prefix for t in TierLayout.for_pipeline(
            hr.Pipeline(Rooted(root), [hr.step(str.upper)])).tiers)

    assert layout("/a") != layout("/b")
    assert layout("/a") == layout("/a")  # the same construction, the same entries
    wrapped = [TierLayout.for_pipeline(hr.Pipeline.from_dataset(ListDataset(list(v)))).tiers
               for v in ("abcd", "wxyz")]
    assert wrapped[0][0].prefix != wrapped[1][0].prefix


class ListDataset(torch.utils.data.Dataset):
    def __init__(self, items: list) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


class Sized:
    """A source whose sample size the training script changes between epochs (a curriculum)."""

    def __init__(self) -> None:
        self.size = 2

    def __len__(self) -> int:
        return 4

    def load(self, i: int) -> np.ndarray:
        return np.full(self.size, i, np.float32)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_source_changed_between_epochs_is_not_served_its_old_entries(workers, no_leaks):
    # the source counted by class and length (and, for a while, by its state when the loader
    # was built): epochs after the change got the first epoch's samples from the cache
    src = Sized()
    loader = hr.DataLoader(hr.Pipeline(src, [hr.step(np.negative)]), batch_size=4,
                           num_workers=workers,
                           options=hr.Options(seed=1, cache=hr.Cache(budget_bytes=1 << 20)))
    shapes = []
    try:
        for _ in range(3):
            shapes.append({tuple(b.shape) for b in loader})
            src.size = 5
        hits = [e.cache.hits for e in loader.stats().epochs]
    finally:
        loader.close()
    assert shapes == [{(4, 2)}, {(4, 5)}, {(4, 5)}]
    assert hits == [0, 0, 4]  # the changed source's entries are stored, then used


def test_a_source_opening_a_handle_on_first_use_reuses_its_entries_after_that(no_leaks):
    # with num_workers=0 its handle opens in this process: one epoch refills, then hits
    loader = hr.DataLoader(hr.Pipeline(Rooted("/a"), [hr.step(str.upper)]), batch_size=2,
                           num_workers=0, options=hr.Options(seed=1, cache=hr.Cache(budget_bytes=1 << 20)))
    try:
        epochs = [[s for batch in loader for s in batch] for _ in range(3)]
        assert [e.cache.hits for e in loader.stats().epochs] == [0, 0, 4]
    finally:
        loader.close()
    assert all(sorted(e) == [f"/A/{i}" for i in range(4)] for e in epochs)
