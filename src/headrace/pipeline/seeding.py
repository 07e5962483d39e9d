"""Per-sample, per-step random streams.

Every random draw a step makes is a pure function of (base seed, epoch, sample index, step key),
so a sample's content never depends on which worker, lane or node ran it, nor on the order the
planner chose for commuting steps. The same key also re-seeds Python's, NumPy's and torch's
global generators before each step, for user code that draws from those.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import operator
import pickle
import random as _pyrandom
import struct
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


def _python_words() -> Any:
    """The global ``random`` generator's Mersenne Twister as CPython lays it out, read in
    place: word 0 the position in the state (624 once seeded), words 1-624 the state (a
    ``ctypes`` array over the object's memory; about 30 ns a word). ``None`` where the layout
    is another (checked here against ``getstate()`` after seeding and after a draw; the
    generator's state is put back)."""
    import ctypes

    if _CRandom.__basicsize__ < object.__basicsize__ + 4 * 625:
        return None
    try:
        view = (ctypes.c_uint32 * 625).from_address(id(_PY) + object.__basicsize__)
        saved = _PY.getstate()
        try:
            for seed in (1, 2**40 + 7):
                _C_SEED(_PY, seed)
                for _ in range(2):
                    words = _PY.getstate()[1]
                    if (view[0], view[1], view[624]) != (words[624], words[0], words[623]):
                        return None
                    _PY.random()
        finally:
            _PY.setstate(saved)
    except Exception:  # noqa: BLE001 - another interpreter: Python's generator is always seeded
        return None
    return view


_PY_WORDS = _python_words()
PYTHON_MARKS = _PY_WORDS is not None
"""Whether :func:`python_mark` can tell a draw from Python's global generator (CPython)."""


def python_mark() -> tuple[int, int, int, Any]:
    """What any draw from Python's global ``random`` generator changes (about 0.3 µs): its
    position in the state, two state words (every 624th word drawn regenerates them) and its
    cached Gaussian (``random.gauss`` draws two at a time). Only where :data:`PYTHON_MARKS`."""
    words = _PY_WORDS
    return words[0], words[1], words[624], _PY.gauss_next


def _numpy_words(bg: Any) -> Any:
    """NumPy's global MT19937 read in place (its ``mt19937_state``: 624 key words, then the
    position), checked against its ``state``; None for another bit generator or layout."""
    import ctypes

    if type(bg) is not np.random.MT19937:
        return None
    try:
        view = (ctypes.c_uint32 * 625).from_address(bg.ctypes.state_address)
        st = bg.state["state"]
        if (view[624], view[0], view[623]) != (st["pos"], st["key"][0], st["key"][623]):
            return None
    except Exception:  # noqa: BLE001 - another NumPy: the state dict is read instead
        return None
    return view


_NP_WORDS: list[Any] = [None, None]
"""[the bit generator last read, its :func:`_numpy_words`] (one lookup a mark)."""


def _torch_part() -> bytes:
    """Bytes 8-23 of torch's CPU generator state (the Mersenne Twister's ``left`` and
    ``next``), read from the state's copy in place (about 1 µs; through NumPy, 1.3)."""
    state = _TORCH.get_state()
    return ctypes.string_at(state.data_ptr() + 8, 16)


def _torch_seeded() -> bytes | None:
    """What :func:`_torch_part` reads right after any ``manual_seed`` (the same for every seed),
    where those bytes change with every draw after a seed, as in torch 2.x; else None. Checked
    with two seeds and a draw; the state is put back."""
    saved = _TORCH.get_state()
    try:
        seeded = []
        for seed in (3, 2**40 + 7):
            _TORCH.manual_seed(seed)
            seeded.append(_torch_part())
            torch.rand(1)
            if _torch_part() == seeded[-1]:
                return None
        if seeded[0] != seeded[1]:
            return None
        _TORCH.manual_seed(5)
        return seeded[0] if _torch_part() == seeded[0] else None
    except Exception:  # noqa: BLE001 - another torch: the whole state is compared instead
        return None
    finally:
        _TORCH.set_state(saved)


_TORCH_SEEDED = _torch_seeded()
_TORCH_COUNTERS = _TORCH_SEEDED is not None


def draw_mark() -> tuple[Any, Any, Any]:
    """What any draw from Python's, NumPy's or torch's global generator changes, once NumPy's
    and torch's were seeded (:func:`seed_globals` clears their cached Gaussians: a draw then
    moves the twister itself; Python's cached one is part of :func:`python_mark`). About 1.4 µs
    where the states can be read in place (CPython, NumPy's MT19937, torch 2.x), else up to
    30 µs. Taken around a step (``SampleRunner``: ``executor="auto"``'s watch, the cache's
    inserts; before a step just seeded, :func:`seeded_mark`) and a collate call probed for
    draws (``runtime/collate_rng.py``)."""
    torch_ = _torch_part() if _TORCH_COUNTERS else _TORCH.get_state().numpy().tobytes()
    return _python_part(), _numpy_part(), torch_


def seeded_mark() -> tuple[Any, Any, Any]:
    """:func:`draw_mark` right after :func:`seed_globals` or :func:`seed_numpy_torch`: torch's
    part is then what any seed leaves (``_TORCH_SEEDED``), not read (about 0.4 µs)."""
    if _TORCH_SEEDED is None:
        return draw_mark()
    return _python_part(), _numpy_part(), _TORCH_SEEDED


def _python_part() -> Any:
    return python_mark() if PYTHON_MARKS else _PY.getstate()


def _numpy_part() -> Any:
    bg = np.random.get_bit_generator()  # type: ignore[attr-defined]
    if _NP_WORDS[0] is not bg:
        _NP_WORDS[0], _NP_WORDS[1] = bg, _numpy_words(bg)
    words = _NP_WORDS[1]
    return ((words[624], words[0], words[623]) if words is not None
            else pickle.dumps(bg.state, protocol=5))


def _numpy_gauss_at(rs: Any) -> int | None:
    """Offset in NumPy's legacy ``RandomState`` ``rs`` of its cached Gaussian (``has_gauss``, a
    C int, then the value, a double 8 bytes on), found on a ``RandomState`` of this module's
    own and checked: a draw caches one, the next serves it, and ``rs``'s ``get_state`` agrees.
    None where the layout is another (:func:`load_mark` then reads ``get_state``, about 40 µs)."""
    probe: Any = np.random.RandomState(1)  # get_state(): (name, key, pos, has_gauss, gauss)
    size = type(probe).__basicsize__
    try:
        probe.standard_normal()
        cached = struct.pack("d", probe.get_state()[4])
        raw = ctypes.string_at(id(probe), size)
        found = [i - 8 for i in range(16, size - 7, 8) if raw[i:i + 8] == cached]
        if len(found) != 1 or type(rs) is not type(probe):
            return None
        at = found[0]

        def read(r: Any) -> tuple[int, bytes]:
            return ctypes.c_int.from_address(id(r) + at).value, ctypes.string_at(id(r) + at + 8, 8)

        probe.standard_normal()
        st: Any = rs.get_state()
        if read(probe)[0] != 0 or read(rs)[0] != st[3] or (
                st[3] and read(rs)[1] != struct.pack("d", st[4])):
            return None
    except Exception:  # noqa: BLE001 - another NumPy: its state is read instead
        return None
    return at


_RAND: Any = getattr(getattr(np.random, "mtrand", None), "_rand", None)
"""The ``RandomState`` that ``np.random.random()`` and the other module functions draw from."""


@functools.cache
def _gauss_at() -> int | None:
    """:func:`_numpy_gauss_at` of ``_RAND``, found at the first :func:`load_mark` (only remote
    workers' proxies take one), not at every ``import headrace``."""
    return _numpy_gauss_at(_RAND) if _RAND is not None else None


def load_mark() -> tuple[Any, ...]:
    """What any draw from Python's, NumPy's or torch's global generator changes, where they
    are not seeded before it (a remote worker's proxy's load, in the training process:
    ``remote/ray_backend.py``): :func:`draw_mark` and, besides, NumPy's legacy cached
    Gaussian and torch's whole state. A Gaussian served
    from the cache an earlier draw left moves no twister: ``draw_mark``, taken where the
    generators were just seeded (which clears those caches), need not see it (a second
    ``torch.randn(1)`` changes only the last 32 bytes of torch's 5,056). About 5 µs
    (docs/design.md)."""
    at = _gauss_at()
    if at is not None:
        gauss: Any = ctypes.string_at(id(_RAND) + at, 16)
    else:
        legacy = np.random.get_state(legacy=False)
        gauss = (legacy["has_gauss"], legacy["gauss"])
    return draw_mark(), gauss, torch.default_generator.get_state().numpy().tobytes()


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
