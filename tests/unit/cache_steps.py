"""What the cache's unit tests share: a source of float arrays, the steps they run (one
drawing from NumPy's global generator undeclared, one deterministic, one declared random) and
a memory cache in a fresh directory, removed after."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numpy as np

from headrace.cache import memory_backend
from headrace.cache.memory_backend import MemoryBackend


class Floats:
    """``n`` samples: sample ``i`` is ``size`` float32s of value ``i``."""

    def __init__(self, n: int, size: int = 256) -> None:
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> np.ndarray:
        return np.full(self.size, i, np.float32)


def draws(x: np.ndarray) -> np.ndarray:
    return x + np.float32(np.random.random())  # not declared random


def scale(x: np.ndarray) -> np.ndarray:
    return x * 2  # deterministic: its output is the decoded form


def flip(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return x + np.float32(rng.random())


@contextlib.contextmanager
def memory_cache(budgets: dict[str, int] | None = None) -> Iterator[MemoryBackend]:
    """A 4 MB memory backend (one shard) with ``budgets`` (default: 1 MB decoded); its
    directory is removed after."""
    path = memory_backend.make_dir()
    b = MemoryBackend(path, 4_000_000, shards=1)
    b.set_budgets(budgets or {"decoded": 1_000_000})
    try:
        yield b
    finally:
        memory_backend.remove_dir(path)
    assert not os.path.exists(path)
