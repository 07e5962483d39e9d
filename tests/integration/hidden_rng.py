"""A helper module with a generator of its own, for ``test_cache_verify.py``: a step calling
``jitter`` draws from a generator neither the step's state nor the global ones hold.

Each process draws its own stream (``fresh``, also after a fork): a forked copy of one stream
gives a sample run by one worker the draws another worker's sample had in an earlier epoch, so
a value equal to the first epoch's could not tell a stale form from a repeated draw."""

from __future__ import annotations

import os

import numpy as np

RNG = np.random.default_rng()


def fresh() -> None:
    """A new unseeded generator for this process."""
    global RNG
    RNG = np.random.default_rng()


os.register_at_fork(after_in_child=fresh)


def jitter(x: np.ndarray) -> np.ndarray:
    return x + np.float32(RNG.random())
