"""Per-sample, per-step random streams.

Every random draw a step makes is a pure function of (base seed, epoch, sample index, step key),
so a sample's content never depends on which worker, lane or node ran it, nor on the order the
planner chose for commuting steps. The same key also re-seeds Python's, NumPy's and torch's
global generators before each step, for user code that draws from those.
"""

from __future__ import annotations

import random as _pyrandom
import zlib

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


def step_key(name: str, occurrence: int = 0) -> int:
    """Stable 32-bit key of a step: CRC32 of its name, mixed with its occurrence number."""
    return (zlib.crc32(name.encode("utf-8")) + 0x9E3779B1 * occurrence) & 0xFFFFFFFF


def step_keys(names: list[str]) -> list[int]:
    """Keys for a list of step names; repeated names get distinct keys by occurrence."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(step_key(n, k))
    return out


def sample_root(base_seed: int, epoch: int, index: int) -> int:
    """A 64-bit seed for one sample of one epoch (NumPy's SeedSequence hashing, ~11 µs):
    computed once per sample run, then mixed with each step's key by :func:`step_seed`."""
    ss = np.random.SeedSequence(entropy=base_seed & _MASK64, spawn_key=(epoch, index))
    lo, hi = ss.generate_state(2, dtype=np.uint32)
    return int(lo) | (int(hi) << 32)


def step_seed(root: int, key: int) -> int:
    """The 64-bit seed of one step of a sample: SplitMix64's finaliser over the sample's root
    and the step key (~0.5 µs; distinct keys give unrelated seeds)."""
    z = (root ^ ((key * 0x9E3779B97F4A7C15) & _MASK64)) & _MASK64
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_seed(base_seed: int, epoch: int, index: int, key: int) -> int:
    """A 64-bit seed for one (sample, step); base_seed is the loader's per-epoch seed."""
    return step_seed(sample_root(base_seed, epoch, index), key)


def step_rng(seed: int) -> np.random.Generator:
    """The generator a random step receives."""
    return np.random.Generator(np.random.PCG64(seed))


def seed_globals(seed: int) -> None:
    """Re-seed Python's, NumPy's and torch's default CPU generators (about 10 µs)."""
    _pyrandom.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch.default_generator.manual_seed(seed & 0x7FFFFFFFFFFFFFFF)
