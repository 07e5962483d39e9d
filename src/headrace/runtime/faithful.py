"""Whether a sample's partial value can be handed off to another worker unchanged.

A hand-off (``runtime/worker.py``, ``TaskRunner``) sends a sample's value between two steps to
another worker, which runs the steps left on what arrives. What arrives must be what a plain
call of the same steps would have gone on with, or the handed-off sample computes something
else. Two things a pickle cannot carry:

* a value that does not pickle at all (an open file, a video container, a lock returned by an
  "open" step and read by the next one): the hand-off would fail the sample;
* parts of the value that share memory: the same tensor or array under two keys, a view of
  another part (``{"img": t, "top": t[:2]}``), the same list or dict twice. The transport
  encodes each leaf on its own (``runtime/transport.py``, ``runtime/ring.py``,
  ``remote/payload.py``), so they arrive as separate copies and a later in-place step
  (``d["img"].mul_(2)``) no longer changes the others;
* a named tuple whose class does not take its fields back (a ``__new__`` of its own): the
  transport rebuilds named tuples from their fields (``ring.map_leaves``), which raised, and
  the handed-off sample failed at step 'transport' where torch delivered it (a review).

:func:`why_it_stays` tells which, in words, or None when the value travels faithfully. It runs
on a value about to be handed off (a sample already over the timeout), and on every value a
remote worker's proxy loads to ship (``Remote(read_source=False)``, ``remote/ray_backend.py``:
each of those crosses), never on the local per-sample path: one walk of the containers plus one
pickling in which tensors and arrays are replaced by nothing (their bytes are never copied),
about 40 µs for an image, its label and a dict of metadata.
The check is conservative: two views of one storage count as shared even where they do not
overlap.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch

try:  # NumPy 2 moved it; pyproject allows NumPy 1.24 on
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # pragma: no cover - NumPy 1.x
    from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]

_COPIED = (dict, torch.Tensor, np.ndarray, bytearray)
"""What the transport copies or rebuilds one by one wherever it appears (with exact lists):
other objects are pickled whole, in one message, which keeps an object reached twice one object."""


def why_it_stays(value: Any) -> str | None:
    """Why ``value`` cannot be handed off faithfully (None: it can)."""
    shared = _shared_part(value, "value", {})
    if shared is not None:
        return shared
    probe = _Probe()
    try:
        probe.dump(value)
    except Exception as e:  # noqa: BLE001 - whatever stops pickling stops the hand-off
        return f"it does not pickle ({type(e).__name__}: {e})"
    return _overlap(probe.spans)


def _shared_part(x: Any, path: str, seen: dict[int, str]) -> str | None:
    """The first dict, list, tensor, array or bytearray reached twice through the containers
    the transport rebuilds (exact dicts, lists, tuples, named tuples; dict subclasses): it
    would arrive as two copies; or the first named tuple the transport could not rebuild."""
    t = type(x)
    if isinstance(x, _COPIED) or t is list:
        if id(x) in seen:
            return f"{path} is the same {t.__name__} as {seen[id(x)]}"
        seen[id(x)] = path
    if isinstance(x, dict):
        items: Any = x.items()
    elif t is list or t is tuple:
        items = enumerate(x)
    elif isinstance(x, tuple) and hasattr(x, "_fields"):
        try:
            t(*x)  # as the transport rebuilds it (a plain named tuple: a cheap tuple)
        except Exception as e:  # noqa: BLE001 - whatever stops the rebuild stops the hand-off
            return (f"{path} is a named tuple ({t.__qualname__}) that its class does not "
                    f"rebuild from its fields ({type(e).__name__}: {e})")
        items = enumerate(x)
    else:
        return None
    for k, v in items:
        found = _shared_part(v, f"{path}[{k!r}]", seen)
        if found is not None:
            return found
    return None


class _Null:
    def write(self, data: bytes) -> int:
        return len(data)


def _nothing() -> None:
    return None


class _Probe(pickle.Pickler):
    """Pickles into nothing, with every tensor and numeric array replaced by nothing after
    noting the memory it lies in (its whole storage: a view counts as the tensor it views)."""

    def __init__(self) -> None:
        super().__init__(_Null(), protocol=pickle.HIGHEST_PROTOCOL)
        self.spans: list[tuple[int, int, str]] = []

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.requires_grad and not obj.is_leaf:  # torch's process pickling refuses it
                raise TypeError("a tensor that requires grad and is not a leaf does not "
                                "cross processes (detach() it)")
            self._note(_tensor_span(obj), obj)
            return _nothing, ()
        if isinstance(obj, np.ndarray):
            self._note(_array_span(obj), obj)
            if obj.dtype != object:
                return _nothing, ()
        return NotImplemented

    def _note(self, span: tuple[int, int] | None, obj: Any) -> None:
        if span is not None:
            self.spans.append((*span, f"a {type(obj).__name__} of shape {tuple(obj.shape)}"))


def _overlap(spans: list[tuple[int, int, str]]) -> str | None:
    """Two of ``spans`` (``(first address, end address, what)``) overlapping, in words."""
    spans.sort()
    for (_, hi, what), (lo, _, other) in zip(spans, spans[1:], strict=False):
        if lo < hi:
            return f"two of its parts share memory ({what} and {other}: a view or one storage)"
    return None


def _tensor_span(t: torch.Tensor) -> tuple[int, int] | None:
    """The CPU storage ``t`` lies in, as addresses (None: empty, not on the CPU, or a layout
    without one storage)."""
    if t.device.type != "cpu" or t.layout != torch.strided:
        return None
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    lo, n = s.data_ptr(), s.nbytes()
    return (lo, lo + n) if n else None


def _array_span(a: np.ndarray) -> tuple[int, int] | None:
    """The memory of the array ``a`` views (its outermost NumPy base), as addresses."""
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.nbytes == 0:
        return None
    lo, hi = byte_bounds(root)
    return lo, hi
