"""The default cache and a step's lookup table of 100 entries the script changes at entry 90
between epochs: only the first 64 items of a container were hashed, so the step kept its
identity and the cache served the old table's samples (a bug hunt: two jobs sharing a Redis
cache, one served the other's)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import headrace as hr

pytestmark = pytest.mark.integration
N = 100


class Remap:
    """A decode-time lookup table (a class relabelling), as a callable object's state."""

    def __init__(self, table) -> None:
        self.table = table

    def __call__(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.002)  # simulated decoding work: worth caching
        return np.array([x[0], self.table[int(x[0])]], np.float32)


class Src:
    def __len__(self) -> int:
        return N

    def load(self, i: int) -> np.ndarray:
        return np.full(4, i, np.int64)


@pytest.mark.parametrize("kind", [list, dict])
def test_a_table_changed_past_its_64th_entry_is_not_served_from_the_old_tables_entries(
        kind, no_leaks):
    table = kind(range(N)) if kind is list else dict(enumerate(range(N)))
    loader = hr.DataLoader(hr.Pipeline(Src(), [hr.step(Remap(table), kind="decode")]),
                           batch_size=10, num_workers=0,
                           options=hr.Options(seed=0, profile_store=False,
                                              cache=hr.Cache(budget_bytes=8 << 20)))
    seen = []
    try:
        for entry in (90, -1, -1):
            table[90] = entry
            seen.append({int(r[0]): float(r[1]) for b in loader for r in b}[90])
        hits = [e.cache.hits for e in loader.stats().epochs]
    finally:
        loader.close()
    assert seen == [90.0, -1.0, -1.0]
    assert hits == [0, 0, N]  # the new table's entries are stored, then used
