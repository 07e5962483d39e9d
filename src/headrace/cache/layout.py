"""Memory layouts of cached arrays (pure): which strides an array has, and how the codec
rebuilds them so that a hit has the layout the computed sample had.

A step's output may be laid out otherwise than row-major (C order): Fortran order, a transpose,
torch's ``channels_last``, a flip (negative strides), a crop (gaps between rows), a broadcast
(zero strides). Values alone would come back C-ordered, and code that depends on the layout
(``flags.f_contiguous``, ``Tensor.view``, a channels_last model's speed) would see a hit differ
from a miss. The codec stores the strides beside the values and rebuilds the array in a buffer
that spans the same bytes as the original's, so a hit has the same shape, dtype and strides.

Strides here are in bytes, as NumPy's (torch's element strides times the element size).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Shape = Sequence[int]


def c_strides(shape: Shape, itemsize: int) -> tuple[int, ...]:
    """The strides of a row-major (C order) array of ``shape``: the layout a plain array gets."""
    out, step = [], itemsize
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def span(shape: Shape, strides: Shape, itemsize: int) -> tuple[int, int]:
    """``(low, high)``: the bytes the elements cover, from the first element's address
    (``low`` <= 0 with negative strides; ``high`` is one past the last byte). For an array with
    at least one element."""
    low = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True))
    high = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides, strict=True)) + itemsize
    return low, high


def dense(shape: Shape, strides: Shape, itemsize: int) -> bool:
    """True when the elements tile their span exactly, with neither gaps nor overlaps: a row-major
    array with its axes permuted and perhaps flipped (C, Fortran, channels_last, a transpose).
    Axes of length 1 take no room, whatever their stride."""
    step = itemsize
    for n, s in sorted(((n, abs(s)) for n, s in zip(shape, strides, strict=True) if n != 1),
                       key=lambda ns: ns[1]):
        if s != step:
            return False
        step *= n
    return True


def memory_order(a: np.ndarray) -> np.ndarray:
    """A view of dense ``a`` whose C order is the order of its bytes in memory (its negative
    axes flipped, its axes sorted by stride): its bytes are the span's, read without a copy."""
    flipped = a[tuple(slice(None, None, -1) if s < 0 else slice(None) for s in a.strides)]
    axes = sorted(range(a.ndim), key=lambda i: -flipped.strides[i])
    return flipped.transpose(axes)


def rebuild(buf: np.ndarray, shape: Shape, strides: Shape, low: int, dtype: np.dtype
            ) -> np.ndarray:
    """The array of ``shape`` and ``strides`` over ``buf`` (the span's bytes, uint8), its first
    element ``-low`` bytes into it; a view, so it shares ``buf``'s memory."""
    return np.ndarray(tuple(shape), dtype=dtype, buffer=buf, offset=-low, strides=tuple(strides))


def stored(a: np.ndarray) -> np.ndarray:
    """The view of ``a`` whose bytes in C order the codec stores: a dense array's memory as it
    lies (no copy), else its values in C order (the only copy; the gaps are not stored)."""
    if dense(a.shape, a.strides, a.itemsize):
        return memory_order(a)
    return np.ascontiguousarray(a)


def fill(buf: np.ndarray, data: np.ndarray, shape: Shape, strides: Shape, dtype: np.dtype
         ) -> np.ndarray:
    """The array of ``shape`` and ``strides`` rebuilt in ``buf`` (uint8, ``span``'s length; zeros
    where a layout with gaps leaves some) from ``data``, the bytes :func:`stored` gave."""
    low, _ = span(shape, strides, dtype.itemsize)
    if dense(shape, strides, dtype.itemsize):
        buf[:] = data
        return rebuild(buf, shape, strides, low, dtype)
    out = rebuild(buf, shape, strides, low, dtype)
    out[...] = data.view(dtype).reshape(tuple(shape))
    return out
