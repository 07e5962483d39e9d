"""Per-sample, per-step random streams.

Every random draw a step makes is a pure function of (base seed, epoch, sample index, step key),
so a sample's content never depends on which worker, lane or node ran it, nor on the order the
planner chose for commuting steps. The same key also re-seeds Python's, NumPy's and torch's
global generators before each step, for user code that draws from those (what a draw from them
changes, to tell one happened: ``pipeline/draw_marks.py``).
"""

from __future__ import annotations

import functools
import hashlib
import operator
import pickle
import random as _pyrandom
import zlib
from _random import Random as _CRandom
from typing import Any

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


def sample_root(base_seed: int, epoch: int, index: Any, draw: int = 0) -> int:
    """A 64-bit seed for one sample of one epoch: the first two 32-bit words NumPy's
    ``SeedSequence(entropy=base_seed, spawn_key=(epoch, key)).generate_state(2)`` gives,
    low word first, computed once per sample run and mixed with each step's key by
    :func:`step_seed`. Bit for bit NumPy's hashing (tested), from a cached pool of the
    sample's (base seed, epoch): about 4 µs a sample instead of NumPy's 12-20.

    ``key`` is :func:`index_key` of the sampler's ``index``: the index itself when it is a
    non-negative integer (NumPy's and torch's integer scalars included). ``draw``: the times
    the index came earlier in this epoch (``runtime/draws.py``); from 1, the spawn key is
    ``(epoch, key, draw)``, so a sample drawn twice gets two streams."""
    cached, h = _epoch_pool(base_seed & _MASK64, epoch)
    pool = list(cached)
    for word in _words(index if type(index) is int and index >= 0 else index_key(index)):
        h = _mix_word(pool, word, h)
    if draw:
        for word in _words(draw):
            h = _mix_word(pool, word, h)
    h = _INIT_B
    out = []
    for value in pool[:2]:
        value ^= h
        h = (h * _MULT_B) & _MASK32
        value = (value * h) & _MASK32
        out.append(value ^ (value >> 16))
    return out[0] | (out[1] << 32)


_HASHED = 1 << 128
"""Set in every hashed key: above any integer index a sampler gives, so none is mistaken for one."""


def index_key(index: Any) -> int:
    """The non-negative integer a sample's seed is drawn from, for whatever the sampler yields
    (torch passes it to ``__getitem__`` unchanged): the index when it is a non-negative
    integer (``operator.index``: Python's, NumPy's and torch's integer scalars), else a
    129-bit hash of its pickled bytes (a string key, a tuple, a negative index, a list of
    indices fetched at once), the same in every process for keys that pickle the same: strings,
    numbers, tuples and lists of them, tensors and arrays (hashed by dtype, shape and values:
    a tensor's pickle holds a memory address). Not sets (their order follows the string hash
    seed); a key that cannot be pickled is hashed from its repr."""
    try:
        i = operator.index(index)
    except TypeError:
        i = -1
    if i >= 0:
        return i
    try:
        raw = pickle.dumps(_canonical(index), protocol=4)
    except Exception:  # noqa: BLE001 - any key still gets a seed
        raw = repr(index).encode("utf-8", "backslashreplace")
    return _HASHED | int.from_bytes(hashlib.blake2b(raw, digest_size=16).digest(), "little")


def _canonical(key: Any) -> Any:
    """``key`` with tensors, arrays and NumPy scalars as plain values (pickled the same in
    every process), inside lists and tuples too."""
    if isinstance(key, (torch.Tensor, np.ndarray)) and key.ndim == 0 or isinstance(key, np.generic):
        return key.item()  # a scalar: its value, as the integers operator.index takes
    if isinstance(key, torch.Tensor):
        return ("torch.Tensor", str(key.dtype), tuple(key.shape), key.tolist())
    if isinstance(key, np.ndarray):
        return ("numpy.ndarray", key.dtype.str, key.shape, key.tolist())
    if type(key) in (list, tuple):
        return type(key)(_canonical(k) for k in key)
    return key


# NumPy's SeedSequence constants (numpy/random/bit_generator.pyx): pool of 4 32-bit words.
_MASK32 = 0xFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715


def _words(n: int) -> list[int]:
    """An int as NumPy's SeedSequence reads it: 32-bit words, least significant first."""
    if n < 0:
        raise ValueError(f"seeds and sample positions are non-negative, got {n}")
    out = [n & _MASK32]
    n >>= 32
    while n:
        out.append(n & _MASK32)
        n >>= 32
    return out


def _hashmix(value: int, h: int) -> tuple[int, int]:
    value ^= h
    h = (h * _MULT_A) & _MASK32
    value = (value * h) & _MASK32
    return value ^ (value >> 16), h


def _mix(x: int, y: int) -> int:
    r = (_MIX_L * x - _MIX_R * y) & _MASK32
    return r ^ (r >> 16)


def _mix_word(pool: list[int], word: int, h: int) -> int:
    """Mix one more entropy word into every word of ``pool`` (in place); the hash constant
    after it. (``_hashmix`` and ``_mix`` inlined: this runs four times per sample.)"""
    for d in range(4):
        value = word ^ h
        h = (h * _MULT_A) & _MASK32
        value = (value * h) & _MASK32
        r = (_MIX_L * pool[d] - _MIX_R * (value ^ (value >> 16))) & _MASK32
        pool[d] = r ^ (r >> 16)
    return h


@functools.lru_cache(maxsize=16)
def _epoch_pool(base_seed: int, epoch: int) -> tuple[tuple[int, ...], int]:
    """SeedSequence's pool and hash constant once the base seed (zero-padded to the pool's
    4 words, as NumPy does when a spawn key follows) and the epoch's words are mixed in."""
    entropy = _words(base_seed)
    if len(entropy) > 4:
        raise ValueError(f"a base seed has at most 128 bits, got {base_seed}")
    entropy += [0] * (4 - len(entropy))
    h = _INIT_A
    pool = []
    for word in entropy:
        value, h = _hashmix(word, h)
        pool.append(value)
    for src in range(4):
        for dst in range(4):
            if src != dst:
                hashed, h = _hashmix(pool[src], h)
                pool[dst] = _mix(pool[dst], hashed)
    for word in _words(epoch):
        h = _mix_word(pool, word, h)
    return tuple(pool), h


def step_seed(root: int, key: int) -> int:
    """The 64-bit seed of one step of a sample: SplitMix64's finaliser over the sample's root
    and the step key (~0.5 µs; distinct keys give unrelated seeds)."""
    z = (root ^ ((key * 0x9E3779B97F4A7C15) & _MASK64)) & _MASK64
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def sample_seed(base_seed: int, epoch: int, index: Any, key: int) -> int:
    """A 64-bit seed for one (sample, step); base_seed is the loader's per-epoch seed."""
    return step_seed(sample_root(base_seed, epoch, index), key)


def step_rng(seed: int) -> np.random.Generator:
    """The generator a random step receives."""
    return np.random.Generator(np.random.PCG64(seed))


_PY: Any = _pyrandom._inst  # what ``random.random()`` and the other module functions draw from
_C_SEED = _CRandom.seed
_NP_SEED = np.random.seed
_TORCH = torch.default_generator


def seed_globals(seed: int) -> None:
    """Re-seed Python's, NumPy's and torch's default CPU generators (about 7 µs; 10-12 µs
    between a pipeline's steps, whose data have taken the caches). Python's is seeded as
    ``random.seed(seed)`` does for a non-negative int, without its Python-level wrapper: the
    C seeding, then no cached Gaussian (``gauss_next``)."""
    _C_SEED(_PY, seed)
    _PY.gauss_next = None
    _NP_SEED(seed & 0xFFFFFFFF)
    _TORCH.manual_seed(seed & 0x7FFFFFFFFFFFFFFF)


def seed_numpy_torch(seed: int) -> None:
    """:func:`seed_globals` but for Python's generator (about 3 µs: Python's seeding, 4 µs of
    the 7, is the one whose use :func:`python_mark` can tell)."""
    _NP_SEED(seed & 0xFFFFFFFF)
    _TORCH.manual_seed(seed & 0x7FFFFFFFFFFFFFFF)


def global_states() -> tuple[Any, Any, torch.Tensor]:
    """Python's, NumPy's and torch's default CPU generator states, for :func:`restore_globals`
    (about 30 µs; NumPy's as the dict ``get_state(legacy=False)`` gives, which also holds a
    global bit generator a user set with ``np.random.set_bit_generator``)."""
    return _pyrandom.getstate(), np.random.get_state(legacy=False), torch.get_rng_state()


def restore_globals(states: tuple[Any, Any, torch.Tensor]) -> None:
    """Put back the states :func:`global_states` took."""
    _pyrandom.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])
