"""Where two values of the cache's format first differ: what the cache's check
(``cache/verify.py``) compares a checked hit's computed form with its stored entry by, when
their encodings differ (a dict's keys in another order encode differently: each process has
its own string hashing, so a dict built from a set of strings does)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from headrace.cache import codec


def difference(stored: Any, computed: Any, path: str = "value") -> str | None:
    """Where two values of the cache's format (``cache/codec.py``) first differ, and how
    (``"value['boxes'][3]: 1 of 4 elements differ (float32, shape (4,))"``), or None when they
    are equal: the same types; dicts with the same keys and equal values, in any key order;
    lists and tuples item by item; arrays and tensors of the same dtype and shape whose elements
    have the same bytes (a NaN equals a NaN of the same bits, 0.0 differs from -0.0; strides
    and a read-only flag are not compared); other values (numbers, strings, bytes, None) by
    type and ``==``, a float by its bits."""
    ta, tb = type(stored), type(computed)
    if ta is not tb:
        return f"{path}: type {ta.__qualname__} stored, {tb.__qualname__} computed"
    if ta is dict:
        only = [k for k in stored if k not in computed] + [k for k in computed if k not in stored]
        if only:
            side = "stored" if only[0] in stored else "computed"
            return f"{path}: key {only[0]!r} only in the {side} form"
        for k in stored:
            d = difference(stored[k], computed[k], f"{path}[{k!r}]")
            if d is not None:
                return d
        return None
    if ta in (list, tuple):
        if len(stored) != len(computed):
            return f"{path}: {len(stored)} items stored, {len(computed)} computed"
        for i, (a, b) in enumerate(zip(stored, computed, strict=True)):
            d = difference(a, b, f"{path}[{i}]")
            if d is not None:
                return d
        return None
    if ta is np.ndarray or isinstance(stored, np.generic) or _is_tensor(stored):
        return _array_difference(stored, computed, path)
    if ta is float:
        same = codec.encode(stored) == codec.encode(computed)  # bits: NaN, -0.0
    else:
        try:
            same = bool(stored == computed)
        except Exception:  # noqa: BLE001 - an == that raises or is not one truth value
            same = codec.encode(stored) == codec.encode(computed)
    return None if same else f"{path}: {_short(stored)} stored, {_short(computed)} computed"


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and type(x) is torch.Tensor


def _array_difference(stored: Any, computed: Any, path: str) -> str | None:
    """:func:`difference` of two arrays, NumPy scalars or tensors of the same type."""
    if stored.dtype != computed.dtype:  # NumPy's: byte order too
        return (f"{path}: dtype {_dtype(stored)} stored, {_dtype(computed)} computed")
    shape = tuple(stored.shape)
    if shape != tuple(computed.shape):
        return f"{path}: shape {shape} stored, {tuple(computed.shape)} computed"
    a, b = _elements(stored), _elements(computed)
    if not a.size or np.array_equal(a, b):  # the bytes (array_equal: one pass, no copy)
        return None
    diff = int(np.count_nonzero((a != b).any(axis=1)))
    return f"{path}: {diff} of {len(a)} elements differ ({_dtype(stored)}, shape {shape})"


def _dtype(x: Any) -> str:
    return str(x.dtype).removeprefix("torch.")


def _elements(x: Any) -> np.ndarray:
    """The bytes of ``x``'s elements, C order, one row per element: a ``uint8`` array of
    shape ``(size, itemsize)`` (a tensor's through ``codec``'s NumPy view)."""
    if _is_tensor(x):
        x = codec.numpy_view(x.contiguous())
    a = np.ascontiguousarray(x)
    return a.reshape(-1).view(np.uint8).reshape(a.size, a.dtype.itemsize)


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."
