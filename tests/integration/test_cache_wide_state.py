"""A source or step whose state is a long container is served no stale form: a source
holding 2,000 annotation dicts (COCO-style) kept its cache key when the script relabelled 8
of them between epochs (the digest hashed 64 of the dicts), and the memory cache served the
old labels where torch and ``cache=None`` delivered the new ones (a review)."""

from __future__ import annotations

import numpy as np
import pytest

import headrace as hr

pytestmark = pytest.mark.integration

N = 2_000
RELABELLED = [1, 2, 3, 5, 6, 7, 9, 10]  # none among the 64 evenly spaced items once hashed


class Annotations:
    def __init__(self) -> None:
        self.items = [{"path": f"img{i}.jpg", "label": 0} for i in range(N)]

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> np.ndarray:
        for _ in range(2):  # simulated decode work: the cache's lookups are worth making
            np.linalg.svd(np.ones((16, 16)))
        return np.array([self.items[i]["label"]], np.int64)


class Param:
    def __init__(self) -> None:
        self.scale = 1


class PerClass:
    """A step holding a per-class table of objects (not plain values)."""

    def __init__(self) -> None:
        self.table = [Param() for _ in range(1_500)]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x * self.table[int(x[0])].scale


def _epochs(pipeline: hr.Pipeline, change, workers: int) -> tuple[list[int], list[int], str]:
    loader = hr.DataLoader(pipeline, batch_size=250, num_workers=workers,
                           options=hr.Options(seed=0, profile_store=False,
                                              cache=hr.Cache(budget_bytes=64 << 20)))
    sums = []
    try:
        for e in range(3):
            if e == 1:
                change()
            sums.append(int(sum(int(b.sum()) for b in loader)))
        hits = [e.cache.hits for e in loader.stats().epochs]
        said = loader.explain()
    finally:
        loader.close()
    return sums, hits, said


@pytest.mark.parametrize("workers", [0, 2])
def test_a_source_relabelled_between_epochs_is_served_the_new_labels(workers, no_leaks):
    src = Annotations()

    def relabel() -> None:
        for i in RELABELLED:
            src.items[i]["label"] = 1

    sums, hits, _ = _epochs(hr.Pipeline(src, [hr.step(np.negative)]), relabel, workers)
    assert sums == [0, -8, -8]  # cache=None and torch
    assert hits[0] == hits[1] == 0 and hits[2] > 0  # new entries, then used


def test_a_step_whose_table_is_sampled_is_not_keyed_and_computes_each_epoch(no_leaks):
    step = PerClass()
    src = Annotations()
    for i in range(N):
        src.items[i]["label"] = 700 + i % 8

    def switch_off() -> None:
        for c in range(700, 708):
            step.table[c].scale = 0

    sums, _, said = _epochs(hr.Pipeline(src, [hr.step(step, name="perclass")]), switch_off, 0)
    assert sums == [sum(700 + i % 8 for i in range(N)), 0, 0]
    assert "step 'perclass' is not keyed" in said and "plain values" in said
