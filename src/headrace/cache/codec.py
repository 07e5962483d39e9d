"""Raw encoding of cached values: arrays and tensors as bytes plus a small header, never pickles.

A cached value is decoded by this module only, so nothing a cache returns can execute code: the
format has no way to name a class or a function. What it stores (recursively):

* ``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``, ``bytes``;
* ``numpy.ndarray`` (any non-object dtype) and numpy scalars: dtype string, shape, raw bytes;
* CPU ``torch.Tensor`` (no grad): dtype name, shape, raw bytes;
* an array or tensor laid out otherwise than in C order (Fortran order, ``channels_last``, a
  transpose, a flip, a crop's gaps, a broadcast): also its strides, and it is decoded with the
  same strides (``cache/layout.py``), so a hit has the layout a computed sample has (a view
  spanning more than ``SPAN_FACTOR`` times its values comes back C-ordered);
* a read-only array (``flags.writeable`` false: ``np.broadcast_to``, ``np.frombuffer`` of
  bytes, one the user locked) comes back read-only: a one-byte prefix (tag ``r``) before its
  encoding, so the entries of writeable arrays are as before;
* ``tuple``, ``list`` and ``dict`` with ``str`` keys (exact types, not subclasses).

Anything else raises :class:`Uncacheable`; the cache then does not store the value (and counts
it). A blob that does not follow the format raises :class:`CorruptEntry` (for example a pickle
planted under a valid key in a shared Redis).

Decoding copies each array once out of the backend's buffer, so the value handed to a step is
private: a step that writes into its input cannot corrupt the cached entry.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from headrace.cache import layout
from headrace.errors import HeadraceError

MAGIC = b"HRC1"
"""First four bytes of every blob (format version 1)."""

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_Parts = list[bytes | memoryview]
"""The pieces ``encode`` joins: headers as bytes, array data as views of the arrays."""
MAX_DEPTH = 32
"""Nesting deeper than this is not cached (and not accepted when decoding)."""


class Uncacheable(TypeError):
    """The value holds something the raw format cannot store; it is simply not cached."""


class CorruptEntry(HeadraceError, ValueError):
    """A cached blob does not follow headrace's raw format (never unpickled, never executed)."""


def encode(value: Any) -> bytes:
    """The blob for ``value``; raises :class:`Uncacheable` for what the format cannot store."""
    out: _Parts = [MAGIC]
    _enc(value, out, 0)
    return b"".join(out)


def _enc(x: Any, out: _Parts, depth: int) -> None:
    # tags: N T F (None, bools), i f s b, a S L (arrays in C order, NumPy scalars, arrays with
    # their strides), r (a read-only array: its a or L follows), t M (tensors in C order,
    # tensors with their strides), ( [ {
    if depth > MAX_DEPTH:
        raise Uncacheable("nested deeper than MAX_DEPTH")
    t = type(x)
    if x is None:
        out.append(b"N")
    elif t is bool:
        out.append(b"T" if x else b"F")
    elif t is int:
        if not -(2**63) <= x < 2**63:
            raise Uncacheable("int outside 64 bits")
        out += [b"i", _I64.pack(x)]
    elif t is float:
        out += [b"f", _F64.pack(x)]
    elif t is str:
        b = x.encode("utf-8")
        out += [b"s", _U64.pack(len(b)), b]
    elif t is bytes:
        out += [b"b", _U64.pack(len(x)), x]
    elif t is np.ndarray:
        laid_out = _laid_out(x.shape, x.strides, x.itemsize)
        if not x.flags.writeable:
            out.append(b"r")
        out.append(b"L" if laid_out else b"a")
        _enc_array(x, out, laid_out)
    elif isinstance(x, np.generic) and not isinstance(x, np.object_):
        out.append(b"S")
        _enc_array(np.asarray(x), out)
    elif t in (tuple, list):
        out += [b"(" if t is tuple else b"[", _U32.pack(len(x))]
        for v in x:
            _enc(v, out, depth + 1)
    elif t is dict:
        out += [b"{", _U32.pack(len(x))]
        for k, v in x.items():
            if type(k) is not str:
                raise Uncacheable("dict with a non-str key")
            _enc(k, out, depth + 1)
            _enc(v, out, depth + 1)
    else:
        _enc_other(x, out)


SPAN_FACTOR = 2
"""A layout is kept only where the bytes its elements span are at most this many times their
own: a hit is rebuilt in a buffer over that span, and a strided view of a large array (every
100th row and column of an image) spans far more than its values (11 MB a hit for 1.2 KB):
such a view is stored, and comes back, C-ordered, its values equal."""


def _laid_out(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """True when an array with elements is not laid out in C order and its layout is kept
    (``SPAN_FACTOR``): its strides are stored."""
    if 0 in shape or tuple(strides) == layout.c_strides(shape, itemsize):
        return False
    low, high = layout.span(shape, strides, itemsize)
    return high - low <= SPAN_FACTOR * itemsize * math.prod(shape)


def _enc_array(a: np.ndarray, out: _Parts, laid_out: bool = False) -> None:
    if a.dtype.hasobject:
        raise Uncacheable("array of Python objects")
    if a.dtype.fields is not None or a.dtype.kind == "V":  # ``dtype.str`` would lose the fields
        raise Uncacheable("structured or void array")
    dt = a.dtype.str.encode()
    out += [bytes([len(dt)]), dt, bytes([a.ndim]), *(_U64.pack(d) for d in a.shape)]
    if laid_out:
        out += [_I64.pack(s) for s in a.strides]
    data = _raw(layout.stored(a) if laid_out else np.ascontiguousarray(a))
    out += [_U64.pack(data.nbytes), data]


def _enc_other(x: Any, out: _Parts) -> None:
    import torch

    if type(x) is not torch.Tensor:
        raise Uncacheable(f"cannot store a {type(x).__qualname__} raw")
    if x.device.type != "cpu" or x.requires_grad or x.is_sparse or x.is_quantized:
        raise Uncacheable("only dense CPU tensors without grad are cached")
    name = str(x.dtype).removeprefix("torch.").encode()
    shape = tuple(x.shape)
    laid_out = _laid_out(shape, tuple(x.stride()), 1)
    a = _as_numpy(x if laid_out else x.contiguous())  # the same memory, strides in bytes
    out += [b"M" if laid_out else b"t", bytes([len(name)]), name, bytes([len(shape)]),
            *(_U64.pack(d) for d in shape)]
    if laid_out:
        out += [_I64.pack(s) for s in a.strides]
    data = _raw(layout.stored(a) if laid_out else a)
    out += [_U64.pack(data.nbytes), data]


def _as_numpy(t: Any) -> np.ndarray:
    """A NumPy view of CPU tensor ``t`` (same memory and strides); bfloat16 and friends, which
    NumPy lacks, as their bits through a same-size integer view."""
    try:
        return t.numpy()
    except TypeError:
        return t.view(_int_view(t.element_size())).numpy()


def numpy_view(t: Any) -> np.ndarray:
    """A NumPy view of CPU tensor ``t`` as ``encode`` reads it (``_as_numpy``), for
    ``cache/verify.py``'s comparison of a tensor's elements."""
    return _as_numpy(t)


def _raw(a: np.ndarray) -> memoryview:
    """The bytes of C-contiguous ``a`` as a flat view, not a copy: ``encode``'s one join is
    the only copy of a large array (``tobytes`` then the join copied it twice)."""
    if a.itemsize == 0 or a.size == 0:
        return memoryview(b"")
    return a.reshape(-1).view(np.uint8).data


def _int_view(size: int) -> Any:
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]


def decode(blob: Any) -> Any:
    """The value stored in ``blob`` (bytes or a buffer); raises :class:`CorruptEntry`."""
    mv = memoryview(blob)
    if mv[:4].tobytes() != MAGIC:
        raise CorruptEntry(
            "cached entry is not in headrace's raw format (bad magic); it was not decoded. "
            "Another program wrote under headrace's keys: clear the cache"
        )
    try:
        value, end = _dec(mv, 4, 0)
    except CorruptEntry:
        raise
    except (struct.error, ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError) as e:
        raise CorruptEntry(f"cached entry is truncated or malformed: {e}") from e
    if end != len(mv):
        raise CorruptEntry("cached entry has trailing bytes")
    return value


def _dec(mv: memoryview, o: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise CorruptEntry("cached entry nested too deep")
    tag = mv[o : o + 1].tobytes()
    o += 1
    if tag == b"N":
        return None, o
    if tag in (b"T", b"F"):
        return tag == b"T", o
    if tag == b"i":
        return _I64.unpack_from(mv, o)[0], o + 8
    if tag == b"f":
        return _F64.unpack_from(mv, o)[0], o + 8
    if tag in (b"s", b"b"):
        n = _U64.unpack_from(mv, o)[0]
        o += 8
        raw = _take(mv, o, n)
        return (raw.decode("utf-8") if tag == b"s" else raw), o + n
    if tag in (b"a", b"S", b"L"):
        a, o = _dec_array(mv, o, tag == b"L")
        return (a[()] if tag == b"S" else a), o
    if tag == b"r":  # a read-only array
        inner = mv[o : o + 1].tobytes()
        if inner not in (b"a", b"L"):
            raise CorruptEntry("cached entry marks a non-array read-only")
        a, o = _dec_array(mv, o + 1, inner == b"L")
        a.flags.writeable = False
        return a, o
    if tag in (b"t", b"M"):
        return _dec_tensor(mv, o, tag == b"M")
    if tag in (b"(", b"["):
        n = _U32.unpack_from(mv, o)[0]
        o += 4
        items = []
        for _ in range(n):
            v, o = _dec(mv, o, depth + 1)
            items.append(v)
        return (tuple(items) if tag == b"(" else items), o
    if tag == b"{":
        n = _U32.unpack_from(mv, o)[0]
        o += 4
        d: dict[str, Any] = {}
        for _ in range(n):
            k, o = _dec(mv, o, depth + 1)
            if type(k) is not str:
                raise CorruptEntry("dict key is not a str")
            d[k], o = _dec(mv, o, depth + 1)
        return d, o
    raise CorruptEntry(f"unknown tag {tag!r} in cached entry")


def _take(mv: memoryview, o: int, n: int) -> bytes:
    if o + n > len(mv):
        raise CorruptEntry("cached entry is truncated")
    return mv[o : o + n].tobytes()


def _shape(mv: memoryview, o: int) -> tuple[tuple[int, ...], int]:
    ndim = mv[o]
    o += 1
    shape = tuple(_U64.unpack_from(mv, o + 8 * i)[0] for i in range(ndim))
    return shape, o + 8 * ndim


def _strides(mv: memoryview, o: int, shape: tuple[int, ...], item: int
             ) -> tuple[tuple[int, ...], int]:
    """The strides (bytes) of a laid-out entry, checked: such an entry has elements."""
    strides = tuple(_I64.unpack_from(mv, o + 8 * i)[0] for i in range(len(shape)))
    if not item or 0 in shape:
        raise CorruptEntry("cached entry has strides but no elements")
    return strides, o + 8 * len(shape)


def _dec_array(mv: memoryview, o: int, laid_out: bool = False) -> tuple[np.ndarray, int]:
    n = mv[o]
    dtype = np.dtype(_take(mv, o + 1, n).decode("ascii"))
    if dtype.hasobject:
        raise CorruptEntry("cached array claims an object dtype")
    shape, o = _shape(mv, o + 1 + n)
    strides, o = _strides(mv, o, shape, dtype.itemsize) if laid_out else ((), o)
    size = _U64.unpack_from(mv, o)[0]
    o += 8
    if size != dtype.itemsize * int(np.prod(shape, dtype=np.int64)) or o + size > len(mv):
        raise CorruptEntry("cached array's size does not match its header")
    if laid_out:  # one copy into a buffer spanning the original's bytes
        low, high = layout.span(shape, strides, dtype.itemsize)
        fresh = np.empty if layout.dense(shape, strides, dtype.itemsize) else np.zeros
        data = np.frombuffer(mv, np.uint8, size, o)
        return layout.fill(fresh(high - low, np.uint8), data, shape, strides, dtype), o + size
    a = np.frombuffer(mv, dtype=dtype, count=size // dtype.itemsize if dtype.itemsize else 0,
                      offset=o).reshape(shape).copy()  # the one copy: the step gets a private array
    return a, o + size


def _dec_tensor(mv: memoryview, o: int, laid_out: bool = False) -> tuple[Any, int]:
    import torch

    n = mv[o]
    dtype = getattr(torch, _take(mv, o + 1, n).decode("ascii"), None)
    if not isinstance(dtype, torch.dtype):
        raise CorruptEntry("cached tensor names an unknown dtype")
    shape, o = _shape(mv, o + 1 + n)
    item = torch.empty((), dtype=dtype).element_size()
    strides, o = _strides(mv, o, shape, item) if laid_out else ((), o)
    size = _U64.unpack_from(mv, o)[0]
    o += 8
    if size != item * int(np.prod(shape, dtype=np.int64)) or o + size > len(mv):
        raise CorruptEntry("cached tensor's size does not match its header")
    if laid_out:
        if any(s < 0 or s % item for s in strides):  # torch has no such strides
            raise CorruptEntry("cached tensor's strides are not whole, non-negative elements")
        _, high = layout.span(shape, strides, item)
        fresh = torch.empty if layout.dense(shape, strides, item) else torch.zeros
        storage = fresh(high // item, dtype=dtype)
        a = _as_numpy(storage)
        layout.fill(a.view(np.uint8), np.frombuffer(mv, np.uint8, size, o), shape, strides,
                    a.dtype)
        return storage.as_strided(shape, tuple(s // item for s in strides)), o + size
    t = torch.empty(shape, dtype=dtype)
    if size:
        dst = t.view(_int_view(item)) if item in (1, 2, 4, 8) else t
        dst.numpy().reshape(-1).view(np.uint8)[:] = np.frombuffer(mv, np.uint8, size, o)
    return t, o + size
