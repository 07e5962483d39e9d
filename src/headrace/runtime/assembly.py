"""Batches assembled in place: each finished sample is copied once, straight into its batch.

torch's ``default_collate`` turns a list of samples of one structure into that structure with
every array leaf stacked along a new first dimension. headrace forms batches in the training
process (a worker cannot know which samples will share its sample's batch), and used to copy
each array out of the worker's ring and then ``torch.stack`` the batch: two copies, a fresh
allocation, and torch's intra-op thread pool woken per batch, all competing with the workers
for the cores (about 60 ms of training-process CPU per 64-image batch on 2 cores).

Here the batcher says which batch and row a sample goes to when it arrives
(``runtime/batcher.py``), so its arrays are copied from the worker's ring into that row of the
batch's tensors right then, by NumPy on the scheduler thread: one copy per array, no
intermediate, no thread pool; the ring space is free as soon as the sample arrived.

Same result as ``default_collate``, by construction:

* only exact ``dict``, ``list``, ``tuple`` and namedtuple containers are walked, and rebuilt as
  ``default_collate`` rebuilds them (a tuple becomes a list, as in torch);
* array leaves are plain CPU tensors and numeric NumPy arrays (native byte order); each becomes
  one tensor of shape ``(rows, *shape)`` and the same dtype, as ``torch.stack`` makes;
* every other leaf (numbers, strings, ``None``, tensor subclasses, ...) is kept per row and
  handed to ``default_collate`` itself when the batch is finished;
* a sample whose structure, leaf kinds, dtypes or shapes differ from the batch's first sample,
  a user ``collate_fn``, or a changed ``default_collate_fn_map`` turn the batch back into a
  list of samples given to ``collate_fn`` (so torch's own error for mismatched shapes is raised).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data._utils import collate as torch_collate

from headrace.runtime.bufferpool import BufferPool
from headrace.runtime.ring import Ring, RingRef, tensor_of
from headrace.runtime.ring import decode as ring_decode
from headrace.runtime.transport import decode, steps_back

Spec = tuple[Any, ...]
"""A sample's structure: nested tuples naming containers and leaves (compared with ``==``)."""

_LEAF_ARRAY = "a"
_LEAF_OBJECT = "o"


def stacks_in_place(collate: Callable[[Any], Any], auto_collation: bool) -> bool:
    """Whether batches for ``collate`` may be assembled in place: it is torch's unmodified
    ``default_collate`` over a list of samples."""
    m = torch_collate.default_collate_fn_map
    return (
        auto_collation
        and collate is torch_collate.default_collate
        and m.get(torch.Tensor) is torch_collate.collate_tensor_fn
        and m.get(np.ndarray) is torch_collate.collate_numpy_array_fn
    )


class BatchAssembly:
    """One batch being filled, row by row, as its samples arrive.

    ``capacity``: rows the batch has room for (its size when complete); ``finish`` takes the
    rows actually filled, so a short last batch or a skipped sample costs no extra pass.
    ``buffers``: where the batch's array memory comes from (``runtime/bufferpool.py``: memory
    of batches already let go of); ``None``: fresh allocations.
    """

    def __init__(
        self,
        capacity: int,
        collate: Callable[[Any], Any],
        auto_collation: bool,
        buffers: BufferPool | None = None,
    ) -> None:
        self.capacity = capacity
        self.buffers = buffers
        self.collate = collate
        self.auto_collation = auto_collation
        self.in_place = stacks_in_place(collate, auto_collation)
        self.indices: dict[int, int] = {}  # row -> dataset index
        self._spec: Spec | None = None
        self._leaves: list[Spec] = []  # leaf specs, in flattening order
        self._tensors: list[torch.Tensor | None] = []  # per leaf: (capacity, *shape), or None
        self._rows: list[np.ndarray | None] = []  # NumPy views of those tensors
        self._objects: list[dict[int, Any]] = []  # per object leaf: row -> value
        self._stored: list[int] = []  # rows stored in place
        self._samples: dict[int, Any] = {}  # list mode: row -> decoded sample

    def put(self, row: int, index: int, value: Any, ring: Ring | None) -> None:
        """Add the sample of dataset ``index`` as row ``row``.

        ``value``: the sample as it arrived; from a worker process (``ring``), as its message
        carried it: array leaves ``RingRef`` into ``ring`` and the other leaves as
        ``transport.encode`` made them (decoded here, in the same walk). Every byte needed
        from the ring is copied before this returns.
        """
        self.indices[row] = index
        if self.in_place:
            leaves: list[Any] = []
            spec = _flatten(value, ring, leaves)
            if self._spec is None:
                self._layout(spec, leaves)
            if spec == self._spec:
                self._store(row, leaves)
                return
            self._to_list()
        self._samples[row] = ring_decode(value, ring, decode) if ring is not None else value

    def finish(self, rows: list[int]) -> Any:
        """The collated batch of ``rows`` (ascending). Raises what ``collate_fn`` raises."""
        if not self.in_place:
            samples = [self._samples[r] for r in rows]
            return self.collate(samples) if self.auto_collation else self.collate(samples[0])
        n = len(rows)
        picked = None if rows[-1] == n - 1 else torch.tensor(rows, dtype=torch.long)
        out: list[Any] = []
        for spec, tensor, objects in zip(self._leaves, self._tensors, self._objects, strict=True):
            if spec[0] == _LEAF_ARRAY:
                assert tensor is not None
                if picked is not None:  # a skipped sample left a hole: compact
                    out.append(tensor.index_select(0, picked))
                else:  # rows 0..n-1: the tensor, or a view of its first rows (contiguous)
                    out.append(tensor if n == self.capacity else tensor[:n])
            else:
                column = [objects[r] for r in rows]
                out.append(torch_collate.default_collate(tuple(column) if spec[1] else column))
        assert self._spec is not None
        return _build(self._spec, iter(out))

    def samples(self, rows: list[int]) -> list[Any]:
        """The samples of ``rows`` as ``collate_fn`` gets them, for an error to compare: rows
        stored in place are rebuilt around views of the batch's tensors (no copy)."""
        if not self.in_place:
            return [self._samples[r] for r in rows]
        return [self._rebuilt(r, copy=False) for r in rows]

    # -- internals ---------------------------------------------------------------------------
    def _layout(self, spec: Spec, leaves: list[Any]) -> None:
        self._spec = spec
        self._leaves = []
        _leaf_specs(spec, self._leaves)
        for leaf in self._leaves:
            if leaf[0] == _LEAF_ARRAY:
                _, _, dtype, shape = leaf
                full = (self.capacity, *shape)
                empty = self.buffers.empty if self.buffers is not None else np.empty
                t = torch.from_numpy(empty(full, np.dtype(dtype)))
                if not t.numel():  # NumPy's strides there are all 0; torch.stack's C order
                    t = torch.empty(full, dtype=t.dtype)
                self._tensors.append(tensor_of(t, leaf[1]))  # bits of a bfloat16: viewed back
                self._rows.append(t.numpy())
            else:
                self._tensors.append(None)
                self._rows.append(None)
            self._objects.append({})

    def _store(self, row: int, leaves: list[Any]) -> None:
        for dst, objects, leaf in zip(self._rows, self._objects, leaves, strict=True):
            if dst is not None:
                dst[row] = leaf  # the layout's dtype and shape: the spec compared equal
            else:
                objects[row] = leaf
        self._stored.append(row)

    def _to_list(self) -> None:
        """Fall back to a list of samples: rebuild the rows stored so far as samples."""
        for row in self._stored:
            self._samples[row] = self._rebuilt(row, copy=True)
        self.in_place = False
        self._tensors, self._rows, self._objects, self._stored = [], [], [], []

    def _rebuilt(self, row: int, copy: bool) -> Any:
        """The sample stored in place in ``row``, its arrays copied out of the batch's
        tensors (``copy``) or views of them."""
        assert self._spec is not None
        leaves = []
        for spec, tensor, objects in zip(self._leaves, self._tensors, self._objects, strict=True):
            if tensor is None:
                leaves.append(objects[row])
            elif spec[1] == "np":
                view = tensor[row].numpy()
                leaves.append(view.copy() if copy else view)
            else:
                leaves.append(tensor[row].clone() if copy else tensor[row])
        return _build(self._spec, iter(leaves), collated=False)


def _flatten(x: Any, ring: Ring | None, leaves: list[Any], in_sequence: bool = False) -> Spec:
    """The structure of ``x``; appends its leaves (array leaves as NumPy arrays) to ``leaves``.

    ``in_sequence``: ``x`` is an item of a tuple, list or namedtuple. default_collate hands
    such items to a leaf's collate function as the tuple ``zip`` made (a dict's values as a
    list), and e.g. strings come back as that very sequence: object leaves record which.
    """
    t = type(x)
    if t is RingRef:
        assert ring is not None
        leaves.append(np.ndarray(x.shape, x.dtype, ring.buf, x.offset))  # a view of the ring
        return (_LEAF_ARRAY, x.kind, x.dtype, x.shape)
    if t is torch.Tensor:
        a = _numpy_of(x)
        if a is not None:
            leaves.append(a)
            return (_LEAF_ARRAY, "torch", a.dtype.str, a.shape)
    elif t is np.ndarray:  # negative strides: an object leaf, default_collate refuses them
        if x.dtype.kind in "biufc" and x.dtype.isnative and not steps_back(x):
            leaves.append(x)
            return (_LEAF_ARRAY, "np", x.dtype.str, x.shape)
    elif t is dict:
        return ("dict", tuple(x), tuple(_flatten(v, ring, leaves) for v in x.values()))
    elif t is tuple or t is list:
        return (t.__name__, tuple(_flatten(v, ring, leaves, True) for v in x))
    elif isinstance(x, tuple) and hasattr(x, "_fields"):
        return ("namedtuple", t, tuple(_flatten(v, ring, leaves, True) for v in x))
    elif ring is not None:  # a worker process's leaf as transport.encode sent it
        value = decode(x)
        if value is not x:
            return _flatten(value, None, leaves, in_sequence)
    leaves.append(x)
    return (_LEAF_OBJECT, in_sequence)


def _numpy_of(x: torch.Tensor) -> np.ndarray | None:
    """A NumPy view of a plain CPU tensor default_collate would stack, else None."""
    if x.layout != torch.strided or x.device.type != "cpu" or x.is_nested or x.requires_grad:
        return None
    try:
        return x.numpy()
    except (TypeError, RuntimeError):  # bfloat16, conjugate/negative views, ...
        return None


def _leaf_specs(spec: Spec, out: list[Spec]) -> None:
    kind = spec[0]
    if kind in (_LEAF_ARRAY, _LEAF_OBJECT):
        out.append(spec)
    else:
        for child in spec[-1]:
            _leaf_specs(child, out)


def _build(spec: Spec, leaves: Iterator[Any], collated: bool = True) -> Any:
    """A tree of structure ``spec`` from its leaves, in flattening order.

    ``collated``: the leaves are collated columns and the tree is the batch, with
    default_collate's containers (a dict stays a dict, a namedtuple its type, a tuple or a list
    becomes a list); otherwise the tree is one sample again (the inverse of ``_flatten``).
    """
    kind = spec[0]
    if kind in (_LEAF_ARRAY, _LEAF_OBJECT):
        return next(leaves)
    if kind == "dict":
        return {k: _build(c, leaves, collated) for k, c in zip(spec[1], spec[2], strict=True)}
    if kind == "namedtuple":
        return spec[1](*(_build(c, leaves, collated) for c in spec[2]))
    items = [_build(c, leaves, collated) for c in spec[1]]
    return tuple(items) if kind == "tuple" and not collated else items
