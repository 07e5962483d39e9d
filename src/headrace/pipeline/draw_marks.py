"""Marks of Python's, NumPy's and torch's global random generators: what any draw from them
changes, read cheaply (in place where the layouts allow), to tell that a step drew from one
(``SampleRunner``: Python's generator left unseeded before a step not known to draw from it,
``executor="auto"``'s watch, the cache's inserts; a collate call probed for draws; a remote
worker's proxy's unseeded load). Seeding itself: ``pipeline/seeding.py``.
"""

from __future__ import annotations

import ctypes
import functools
import pickle
import struct
from _random import Random as _CRandom
from typing import Any

import numpy as np
import torch

from headrace.pipeline.seeding import _C_SEED, _PY, _TORCH


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
