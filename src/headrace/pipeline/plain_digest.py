"""Containers of plain values hashed whole in one pass, at C speed: the digest's path for a
container it would otherwise count by a sample (``value_digest._items_digest``).

Plain values are ``None``, ``bool``, ``int``, ``float``, ``str`` and ``bytes`` (exact types),
NumPy scalars and NumPy arrays of up to ``_ARRAY_BYTES`` (by dtype, shape and bytes), in dicts,
lists and tuples nested at any depth: a COCO-style list of annotation dicts, a per-class table
of numbers (built with NumPy or not), a list of paths. They are pickled without a memo (equal values give
equal bytes, whichever objects repeat), dicts in insertion order, and anything else met (an
object, a set, whose order string hashing decides, a subclass such as an ``IntEnum``, a NumPy
scalar, a cycle) makes the container not plain: the caller then hashes it as before.
"""

from __future__ import annotations

import hashlib
import io
import pickle
from typing import Any

import numpy as np

from headrace.pipeline.digest_scope import left_plain, note_whole, spend, whole_digest

_CHUNK = 1 << 10
"""Items pickled at a time; the digest's budget (``digest_scope.TOTAL_PLAIN``) is charged and
checked after each chunk."""


_ARRAY_BYTES = 1 << 20
"""NumPy arrays of up to this many bytes inside a container count as plain values (a larger
one, or an ``np.memmap``, makes the container not plain: it is hashed as an array is)."""


_NUMPY_COST = 512
"""Bytes of ``digest_scope.TOTAL_PLAIN`` a NumPy value in a plain container is charged, for
the time it takes (a Python call, about 1.5 µs: 100,000 dicts of an ``np.int64`` and a
4-element array took 0.31 s), whatever its size: at most 262,144 of them in one digest."""


class _NotPlain(Exception):
    """Raised by :class:`_PlainPickler` on a value that is not plain."""


class _PlainPickler(pickle.Pickler):
    """Pickles plain values only. Protocol 3: the C pickler writes exact ``None``, ``bool``,
    ``int``, ``float``, ``str``, ``bytes``, ``dict``, ``list`` and ``tuple`` itself and asks
    ``reducer_override`` for everything else, sets and frozensets included (below protocol 4
    they are pickled through their class)."""

    allowance = 0
    """Bytes of the running digest's ``TOTAL_PLAIN`` left for this chunk; each NumPy value
    takes ``_NUMPY_COST`` of it as it is met (none left: not plain)."""

    def reducer_override(self, obj: Any) -> Any:
        numpy = type(obj) is np.ndarray and not obj.dtype.hasobject \
            and obj.nbytes <= _ARRAY_BYTES or isinstance(obj, np.generic) \
            and not isinstance(obj, np.object_)
        if numpy:
            self.allowance -= _NUMPY_COST
            if self.allowance < 0:
                raise _NotPlain
            return _numpy, (obj.dtype.str, obj.shape, obj.tobytes())
        if obj is _numpy:
            return NotImplemented  # pickled by its name
        raise _NotPlain


def _numpy(dtype: str, shape: tuple[int, ...], data: bytes) -> None:
    """What a NumPy value in a plain container is pickled as (never called: nothing is
    unpickled)."""


def plain_digest(items: list[Any] | tuple[Any, ...]) -> str | None:
    """The SHA-256 (12 hex digits) of all of ``items`` when every one is a plain value (module
    docstring) and the running digest's ``TOTAL_PLAIN`` budget holds their pickled bytes
    (charged as they are pickled, up to the failing chunk); else None. A container the running
    digest hashed already counts by that digest, and is not charged again."""
    seen = whole_digest(items)
    if seen is not None:
        return seen
    h = hashlib.sha256(f"plain{len(items)}:".encode())
    buf = io.BytesIO()
    pickler = _PlainPickler(buf, 3)
    pickler.fast = True  # no memo: the bytes follow the values (a cycle raises ValueError)
    for start in range(0, len(items), _CHUNK):
        buf.seek(0)
        buf.truncate()
        pickler.allowance = left_plain()
        try:
            pickler.dump(items[start:start + _CHUNK])
        except (_NotPlain, ValueError, RecursionError, pickle.PicklingError):
            return None
        view = buf.getbuffer()
        try:
            if not spend(plain=len(view) + left_plain() - pickler.allowance):
                return None
            h.update(view)
        finally:
            view.release()
    note_whole(items, h.hexdigest()[:12])
    return h.hexdigest()[:12]


def kinds_in_words(kinds: set[type]) -> str:
    """The type names of a container's items, in words (at most 3), for a digest's ``cut``."""
    names = sorted(t.__name__ for t in kinds)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
