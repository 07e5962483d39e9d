"""Payload size and type signature of a sample, as the profiler measures them after each step.

``payload_bytes`` counts the bytes a sample's data occupies, the quantity Pecan's inflation
factor compares (bytes out / bytes in): tensors and arrays count their own elements (a view
counts its extent, not its base storage), containers the sum of their leaves. It never uses
``sys.getsizeof``, which counts Python object headers, not data. It runs per step per sample, so
the common types are dispatched on their exact type first, without ``isinstance`` chains.

``type_signature`` is a cheap, hashable summary (container/array type, rank and dtype) used to
flag the steps that change a sample's type, rank or dtype: AutoOrder treats those as barriers
(Pecan §5.2 for type and rank; the dtype is headrace's addition, ``docs/design.md``).
``shape_signature`` adds dtypes, shapes and lengths: a step whose output has its input's shape
signature on every sample kept the sample's dtype and shape, and AutoOrder lets only such a
step swap places with another (``planner/commute.py``).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import torch

__all__ = [
    "NUMBER_BYTES", "measure", "payload_bytes", "shape_signature", "signatures", "type_signature",
]

NUMBER_BYTES = 8
"""Bytes counted for a Python number (int, float, bool): the width of a C double / int64."""

_MAX_DEPTH = 64
_NUMBER_TYPES = frozenset({int, float, bool})


def _tensor_bytes(x: torch.Tensor) -> int:
    if x.is_nested and x.layout is torch.strided:  # no numel(): its components'
        return sum(_tensor_bytes(c) for c in x.unbind())
    if x.layout is torch.strided:
        return x.numel() * x.element_size()
    if x.layout is torch.sparse_coo:
        return _tensor_bytes(x._values()) + _tensor_bytes(x._indices())
    if x.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = (x.values(), x.crow_indices(), x.col_indices())
    elif x.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = (x.values(), x.ccol_indices(), x.row_indices())
    else:  # other layouts (jagged, mkldnn): dense extent
        return x.numel() * x.element_size()
    return sum(_tensor_bytes(p) for p in parts)


def _array_bytes(x: np.ndarray) -> int:
    if x.dtype.hasobject:
        return sum(payload_bytes(v) for v in x.flat)
    return int(x.nbytes)


def _str_bytes(x: str) -> int:
    return len(x) if x.isascii() else len(x.encode("utf-8", "surrogatepass"))


def _number_bytes(_x: Any) -> int:
    return NUMBER_BYTES


_EXACT: dict[type, Callable[[Any], int]] = {
    torch.Tensor: _tensor_bytes,
    torch.nn.Parameter: _tensor_bytes,
    np.ndarray: _array_bytes,
    bytes: len,
    bytearray: len,
    memoryview: lambda m: m.nbytes,
    str: _str_bytes,
    int: _number_bytes,
    float: _number_bytes,
    bool: _number_bytes,
    complex: lambda _x: 2 * NUMBER_BYTES,
    type(None): lambda _x: 0,
}


def payload_bytes(x: Any) -> int:
    """Payload size of ``x`` in bytes.

    - torch tensors: ``numel * element_size`` (a view counts its own extent; sparse tensors
      count their values and indices); numpy arrays: ``nbytes`` (object arrays: their items);
      numpy scalars: their item size.
    - ``bytes``, ``bytearray``, ``memoryview``: their length in bytes; ``str``: UTF-8 length.
    - PIL images: width x height x bands x bytes per band (1, 2 for ``I;16*``, 4 for ``I``/``F``).
    - Python numbers: 8 (``complex``: 16); ``None``: 0.
    - ``dict`` (values only), ``list``, ``tuple``, named tuples, sets, dataclass instances: the
      sum of their leaves, each container counted once however often it is referenced (as
      pickle does: a tree whose nodes point back at their parents was walked again through every
      back-reference, for ever in effect).
    - anything else: ``len(pickle.dumps(x))``, or 0 when it cannot be pickled.
    """
    return _payload(x, 0, set())


def _payload(x: Any, depth: int, seen: set[int]) -> int:
    t = type(x)
    fast = _EXACT.get(t)
    if fast is not None:
        return fast(x)
    if id(x) in seen:  # a container met before: counted there
        return 0
    seen.add(id(x))
    if t is list or t is tuple:
        return _sequence_bytes(x, depth, seen)
    if t is dict:
        return (sum(_payload(v, depth + 1, seen) for v in x.values()) if depth < _MAX_DEPTH
                else _pickled(x))
    return _payload_slow(x, depth, seen)


def _sequence_bytes(x: list[Any] | tuple[Any, ...], depth: int, seen: set[int]) -> int:
    if depth >= _MAX_DEPTH:
        return _pickled(x)
    if len(x) > 16 and set(map(type, x)) <= _NUMBER_TYPES:
        return NUMBER_BYTES * len(x)  # token ids and the like: C-speed type check
    return sum(_payload(v, depth + 1, seen) for v in x)


def _payload_slow(x: Any, depth: int, seen: set[int]) -> int:
    """Subclasses and the less common types, in order of likelihood."""
    if isinstance(x, torch.Tensor):
        return _tensor_bytes(x)
    if isinstance(x, np.ndarray):
        return _array_bytes(x)
    if isinstance(x, np.generic):
        return int(x.itemsize)
    if _looks_like_pil(x):
        return _pil_bytes(x)
    if isinstance(x, (list, tuple, set, frozenset)):  # named tuples included
        if depth >= _MAX_DEPTH:
            return _pickled(x)
        return sum(_payload(v, depth + 1, seen) for v in x)
    if isinstance(x, dict):
        if depth >= _MAX_DEPTH:
            return _pickled(x)
        return sum(_payload(v, depth + 1, seen) for v in x.values())
    if isinstance(x, (bytes, bytearray)):
        return len(x)
    if isinstance(x, str):
        return _str_bytes(x)
    if isinstance(x, (int, float)):
        return NUMBER_BYTES
    if isinstance(x, complex):
        return 2 * NUMBER_BYTES
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        if depth >= _MAX_DEPTH:
            return _pickled(x)
        return sum(_payload(getattr(x, f.name), depth + 1, seen) for f in dataclasses.fields(x))
    return _pickled(x)


def _pickled(x: Any) -> int:
    try:
        return len(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - an unpicklable leaf has no measurable payload
        return 0


def _looks_like_pil(x: Any) -> bool:
    """PIL images are recognised by module and duck type, so PIL is never imported here."""
    return type(x).__module__.startswith("PIL.") and hasattr(x, "getbands") and hasattr(x, "size")


def _pil_bytes(img: Any) -> int:
    width, height = img.size
    mode: str = img.mode
    if mode in ("I", "F"):
        per_band = 4
    elif mode.startswith("I;16"):
        per_band = 2
    else:
        per_band = 1  # "1" is stored one byte per pixel, as numpy sees it
    return int(width) * int(height) * len(img.getbands()) * per_band


def type_signature(x: Any, depth: int = 0) -> Hashable:
    """Hashable (type, rank, dtype) summary of a sample; compare a step's input and output
    signatures.

    Tensors and arrays give ``(type, ndim, dtype)``, PIL images ``("PIL", mode)``; tuples
    (positionally) and dicts (by key) of at most 8 items recurse two levels deep, lists give the
    set of their first 8 items' signatures (so length does not matter), anything else gives
    ``(type,)``. The dtype counts: Pecan moves casts (Cast+Normalize in RetinaNet), but a step
    measured after a cast kept its dtype only there: a normalize moved before a cast to float
    ran on uint8, where ``x - 128`` wraps (a bug hunt's find: every sample of an epoch wrong).
    """
    t = type(x)
    if t is torch.Tensor or t is np.ndarray or isinstance(x, (torch.Tensor, np.ndarray)):
        return (t, x.ndim, x.dtype)
    if _looks_like_pil(x):
        return ("PIL", x.mode)
    if isinstance(x, tuple):  # a structure, e.g. (image, label): positional
        if depth >= 2 or len(x) > 8:
            return (t, "...")
        return (t, tuple(type_signature(v, depth + 1) for v in x))
    if isinstance(x, list):  # a collection of any length: the kinds of its first items
        if depth >= 2:
            return (t, "...")
        return (t, frozenset(type_signature(v, depth + 1) for v in x[:8]))
    if isinstance(x, dict):
        if depth >= 2 or len(x) > 8:
            return (t, "...")
        return (t, tuple((k, type_signature(v, depth + 1)) for k, v in x.items()))
    return (t,)


_SIZED = (str, bytes, bytearray)
_LEAVES = frozenset({int, float, bool, complex, type(None)})


def shape_signature(x: Any, depth: int = 0) -> Hashable:
    """Hashable (type, dtype, shape) summary of a sample: a step kept its sample's dtype and
    shape when its output's signature equals its input's.

    Tensors and arrays give ``(type, dtype, shape)``, PIL images ``("PIL", mode, size)``,
    ``str``/``bytes`` their type and length; tuples and dicts of at most 8 items recurse two
    levels deep (deeper or longer: type and length), lists give their length and their first 8
    items' signatures; anything else (numbers included) gives ``(type,)``. Unlike
    :func:`type_signature`, a cast, a crop, a resize or a pad changes it; a flip, a rotation
    in place or a normalisation in the same dtype does not.
    """
    t = type(x)
    if t is np.ndarray or t is torch.Tensor:
        return (t, x.dtype, x.shape)
    if t in _LEAVES:  # labels and the like: the common case inside a structure, checked first
        return (t,)
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return (t, x.dtype, tuple(x.shape))
    if _looks_like_pil(x):
        return ("PIL", x.mode, tuple(x.size))
    if isinstance(x, _SIZED):
        return (t, len(x))
    if isinstance(x, (tuple, list)):
        if depth >= 2 or (t is not list and len(x) > 8):
            return (t, len(x), "...")
        return (t, len(x), tuple(shape_signature(v, depth + 1) for v in x[:8]))
    if isinstance(x, dict):
        if depth >= 2 or len(x) > 8:
            return (t, len(x), "...")
        return (t, tuple((k, shape_signature(v, depth + 1)) for k, v in x.items()))
    return (t,)


def signatures(x: Any, depth: int = 0) -> tuple[Hashable, Hashable]:
    """``(type_signature(x), shape_signature(x))`` in one walk: the common types (arrays,
    tensors, numbers, strings, plain dicts, tuples and lists) are dispatched on their exact
    type; anything else is left to the two functions."""
    t = type(x)
    if t is np.ndarray or t is torch.Tensor:
        return (t, x.ndim, x.dtype), (t, x.dtype, x.shape)
    if t in _LEAVES:
        sig = (t,)
        return sig, sig
    if t is str or t is bytes:
        return (t,), (t, len(x))
    if t is dict:
        if depth >= 2 or len(x) > 8:
            return (t, "..."), (t, len(x), "...")
        items = [(k, signatures(v, depth + 1)) for k, v in x.items()]
        return (t, tuple((k, a) for k, (a, _) in items)), (t, tuple((k, b) for k, (_, b) in items))
    if t is tuple:
        if depth >= 2 or len(x) > 8:
            return (t, "..."), (t, len(x), "...")
        pairs = [signatures(v, depth + 1) for v in x]
        return (t, tuple(a for a, _ in pairs)), (t, len(x), tuple(b for _, b in pairs))
    if t is list:
        if depth >= 2:
            return (t, "..."), (t, len(x), "...")
        pairs = [signatures(v, depth + 1) for v in x[:8]]
        return (t, frozenset(a for a, _ in pairs)), (t, len(x), tuple(b for _, b in pairs))
    return type_signature(x, depth), shape_signature(x, depth)


def measure(x: Any) -> tuple[int, Hashable, Hashable]:
    """(payload bytes, type signature, shape signature) of a step's output: what workers
    record per step. What cannot be read of a value (a nested tensor of the strided layout has
    no ``shape``) is measured as 0 bytes, its type alone, or a shape signature equal to no other
    (its step then counts as changing the shape): the profiler's reading never fails a sample
    (it raised outside the step's own error handling: a worker died, or with ``num_workers=0``
    an error named no sample and no step)."""
    try:
        size = payload_bytes(x)
    except Exception:  # noqa: BLE001 - the profiler's limit, not the sample's error
        size = 0
    try:
        return (size, *signatures(x))
    except Exception:  # noqa: BLE001 - likewise
        pass
    try:
        sig = type_signature(x)
    except Exception:  # noqa: BLE001 - likewise
        sig = (type(x),)
    return size, sig, (type(x), object())
