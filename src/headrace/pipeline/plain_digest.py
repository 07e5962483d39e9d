"""Containers of plain values hashed whole in one pass, at C speed: the digest's path for a
container it would otherwise count by a sample (``value_digest._items_digest``).

Plain values are ``None``, ``bool``, ``int``, ``float``, ``str`` and ``bytes`` (exact types),
NumPy scalars and NumPy arrays of up to ``_ARRAY_BYTES`` (by dtype, its fields' names and types
for a structured one, shape and bytes), in dicts, lists and tuples nested at any depth: a
COCO-style list of annotation dicts, a per-class table of numbers (built with NumPy or not), a
list of paths. They are pickled without a memo (equal values give equal bytes, whichever
objects repeat), each dict in the order of its sorted keys (equal dicts give equal bytes,
whatever order their keys were inserted in: a dict built from a set of strings gets another
insertion order in each process, as string hashing is seeded anew), and anything else met (an
object, a set, whose order string hashing decides, a subclass such as an ``IntEnum``, a NumPy
object array or scalar, a cycle) makes the container not plain: the caller then hashes it by a
sample.
"""

from __future__ import annotations

import hashlib
import io
import operator
import pickle
from itertools import chain, compress, repeat
from typing import Any

import numpy as np

import headrace.pipeline.digest_scope as scope
from headrace.pipeline.digest_scope import (
    MAX_NESTING,
    left_plain,
    note_cut,
    note_whole,
    spend,
    whole_digest,
)

_CHUNK = 1 << 10
"""Items pickled at a time; the digest's budget (``digest_scope.TOTAL_PLAIN``) is charged and
checked after each chunk."""


_ARRAY_BYTES = 1 << 20
"""NumPy arrays of up to this many bytes inside a container count as plain values (a larger
one, or an ``np.memmap``, makes the container not plain: it is hashed as an array is)."""


_NUMPY_COST = 512
"""Bytes of ``digest_scope.TOTAL_PLAIN`` a NumPy value in a plain container is charged, for
the time it takes (a Python call, about 1.5 µs: 100,000 dicts of an ``np.int64`` and a
4-element array took 0.31 s), whatever its size: at most 1,048,576 of them in one digest."""


_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
"""The plain values that are not containers (exact types)."""
_SEQUENCES = frozenset({list, tuple})


class _NotPlain(Exception):
    """Raised by :class:`_PlainPickler` on a value that is not plain."""


class _OverBudget(Exception):
    """Raised by :class:`_PlainPickler` when its NumPy values spend the digest's budget."""


class _PlainPickler(pickle.Pickler):
    """Pickles plain values only. Protocol 3: the C pickler writes exact ``None``, ``bool``,
    ``int``, ``float``, ``str``, ``bytes``, ``dict``, ``list`` and ``tuple`` itself and asks
    ``reducer_override`` for everything else, sets and frozensets included (below protocol 4
    they are pickled through their class)."""

    allowance = 0
    """Bytes of the running digest's ``TOTAL_PLAIN`` left for this chunk; each NumPy value
    takes ``_NUMPY_COST`` of it as it is met (none left: not plain)."""

    def reducer_override(self, obj: Any) -> Any:
        numpy = (type(obj) is np.ndarray and obj.nbytes <= _ARRAY_BYTES
                 or isinstance(obj, np.generic)) and not obj.dtype.hasobject
        if numpy:
            self.allowance -= _NUMPY_COST
            if self.allowance < 0:
                raise _OverBudget
            dtype = obj.dtype  # a structured one by its fields: '|V8' is any 8 bytes
            return _numpy, (dtype.descr if dtype.fields else dtype.str, obj.shape, obj.tobytes())
        if obj is _numpy:
            return NotImplemented  # pickled by its name
        raise _NotPlain


def _numpy(dtype: Any, shape: tuple[int, ...], data: bytes) -> None:
    """What a NumPy value in a plain container is pickled as (never called: nothing is
    unpickled)."""


def plain_digest(items: list[Any] | tuple[Any, ...]) -> str | None:
    """The SHA-256 (12 hex digits) of all of ``items`` when every one is a plain value (module
    docstring) and the running digest's ``TOTAL_PLAIN`` budget holds their pickled bytes
    (charged as they are pickled, up to the failing chunk); else None, and past the budget the
    digest's cut says so (``Findings.too_large``). A container the running digest hashed already
    counts by that digest, and is not charged again."""
    seen = whole_digest(items)
    if seen is not None:
        return seen
    h = hashlib.sha256(f"plain{len(items)}:".encode())
    buf = io.BytesIO()
    pickler = _PlainPickler(buf, 3)
    pickler.fast = True  # no memo: the bytes follow the values (a cycle raises ValueError)
    for start in range(0, len(items), _CHUNK):
        chunk = items[start:start + _CHUNK]
        try:
            # pickled as it is first (not a chunk of dicts): without a byte '}' (EMPTY_DICT)
            # it holds no dict, and these are the bytes of its dicts' keys in order
            data = b"" if type(chunk[0]) is dict else _pickled(pickler, buf, chunk)
            if not data or b"}" in data:  # a dict, maybe (or that byte in a string, a number)
                ordered = _keys_sorted(chunk)
                if not data or ordered is not chunk:
                    data = _pickled(pickler, buf, ordered)
        except (_NotPlain, ValueError, RecursionError, pickle.PicklingError):
            return None
        except _OverBudget:
            _over_budget(items)
            return None
        if not spend(plain=len(data) + left_plain() - pickler.allowance):
            _over_budget(items)
            return None
        h.update(data)
    note_whole(items, h.hexdigest()[:12])
    return h.hexdigest()[:12]


def _pickled(pickler: _PlainPickler, buf: io.BytesIO, chunk: Any) -> bytes:
    """The bytes of ``chunk`` pickled by ``pickler`` into ``buf`` (emptied first), its NumPy
    values charged to what is left of the running digest's ``TOTAL_PLAIN``."""
    buf.seek(0)
    buf.truncate()
    pickler.allowance = left_plain()
    pickler.dump(chunk)
    return buf.getvalue()


def _over_budget(items: Any) -> None:
    """Record that plain ``items`` were past the running digest's ``TOTAL_PLAIN``."""
    note_cut(f"a container of {len(items):,} items of {kinds_in_words(set(map(type, items)))} "
             f"(plain values, but over the {scope.TOTAL_PLAIN >> 20} MiB of them one digest hashes "
             "whole) was hashed by a sample", too_large=True)


def _keys_sorted(chunk: list[Any] | tuple[Any, ...]) -> Any:
    """Plain ``chunk`` with each dict in it, at any depth, in the order of its sorted keys:
    ``chunk`` itself when all were already, else a copy of the containers on their path. At C
    speed for a chunk holding no dict at any depth (a million ``(path, label)`` records: no
    Python call per record) and for one of dicts of one set of keys holding none (COCO's
    annotations); else by :func:`_in_key_order`, a Python call per container."""
    if type(chunk[0]) is dict and len(set(map(len, chunk))) == 1 and set(map(type, chunk)) \
            == {dict}:
        keys = _sorted_keys(list(chunk[0]))
        if len(keys) > 1:
            try:
                values = list(map(operator.itemgetter(*keys), chunk))
            except KeyError:  # dicts of other keys
                values = None
            if values is not None and _no_dicts(values):
                out = list(map(dict, map(zip, repeat(keys), values)))
                return out if type(chunk) is list else tuple(out)
    elif _no_dicts(chunk):
        return chunk
    return _in_key_order(chunk)


def _in_key_order(value: Any) -> Any:
    """Plain ``value`` with each dict in it, at any depth, in the order of its sorted keys:
    ``value`` itself when all were already, else a copy of the containers on their path. A
    list or tuple holding no dict at any depth is told apart level by level at C speed (a
    million ``(path, label)`` records, no Python call per record); each dict costs a Python
    call, a sort of its keys and, out of order, a new dict. What is not plain is left as it is,
    for the pickler to refuse."""
    kind = type(value)
    if kind is dict:
        keys = list(value)
        ordered = _sorted_keys(keys)
        values = list(map(value.__getitem__, ordered))
        new = [v if type(v) in _SCALARS else _in_key_order(v) for v in values]
        if keys == ordered and all(map(operator.is_, new, values)):
            return value
        return dict(zip(ordered, new, strict=True))
    if kind in _SEQUENCES and not _no_dicts(value):
        new = [v if type(v) in _SCALARS else _in_key_order(v) for v in value]
        if not all(map(operator.is_, new, value)):
            return new if kind is list else tuple(new)
    return value


def _sorted_keys(keys: list[Any]) -> list[Any]:
    """A dict's ``keys`` in an order the same in every process: by value when all are ints,
    all strings or all bytes, else by ``repr`` (keys of equal ``repr`` stay in insertion
    order: equal dicts may then give other bytes, never unequal ones the same)."""
    kinds = set(map(type, keys))
    if len(kinds) == 1 and kinds <= {int, str, bytes}:
        return sorted(keys)
    return sorted(keys, key=repr)


def _no_dicts(seq: list[Any] | tuple[Any, ...]) -> bool:
    """Whether list or tuple ``seq`` holds no dict at any depth, level by level through its
    lists and tuples at C speed, the deepest level's items typed but not listed (False past
    ``MAX_NESTING`` levels: a cycle)."""
    parents: Any = seq
    kinds = set(map(type, seq))
    for _ in range(MAX_NESTING):
        if dict in kinds:
            return False
        if not kinds & _SEQUENCES:
            return True
        if not kinds <= _SEQUENCES:  # the lists and tuples among other values
            parents = list(compress(parents, map(_SEQUENCES.__contains__, map(type, parents))))
        kinds = set(map(type, chain.from_iterable(parents)))
        if kinds & _SEQUENCES:
            parents = list(chain.from_iterable(parents))
    return False


def kinds_in_words(kinds: set[type]) -> str:
    """The type names of a container's items, in words (at most 3), for a digest's ``cut``."""
    names = sorted(t.__name__ for t in kinds)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
