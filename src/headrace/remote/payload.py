"""Samples crossing to and from remote workers as arrays, not pickles of torch objects.

Ray stores NumPy arrays in its object store as raw buffers (pickle protocol 5, out of band):
the receiver maps them without a copy. A torch tensor is pickled through torch's own
reduction instead (a storage object, more metadata, one more copy). ``pack`` turns every CPU
tensor of a sample (inside dicts, lists, tuples and named tuples) into a :class:`TensorLeaf` holding its
array; ``unpack`` turns them back, so the training process gets the same tensors (dtype,
shape, values) it would get from a local worker. NumPy arrays travel as they are and are
copied once on arrival when Ray hands them over read-only. Other leaves travel as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_map_only


class TensorLeaf:
    """A CPU tensor carried as its NumPy array (``unpack`` makes it a tensor again)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (TensorLeaf, (self.array,))


def _packable(t: torch.Tensor) -> bool:
    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided
            and not t.requires_grad and t.dtype != torch.bfloat16 and not t.is_conj()
            and not t.is_neg())


def pack(x: Any) -> Any:
    """``x`` with CPU tensors replaced by :class:`TensorLeaf` (inside the containers torch's
    pytree walks: dicts, lists, tuples, named tuples)."""
    return tree_map_only(torch.Tensor, _pack_tensor, x)


def unpack(x: Any) -> Any:
    """The inverse of :func:`pack`. Arrays from Ray's object store are read-only views of
    shared memory: they are copied once into writable tensors, and NumPy arrays that arrive
    read-only into writable arrays (what a local worker's sample holds), so the user may change
    them in place. Only arrays inside the containers torch's pytree walks are reached: one
    held by another object (a dataclass's field) stays as Ray made it."""
    return tree_map_only((TensorLeaf, np.ndarray), _unpack_leaf, x)


def _pack_tensor(t: torch.Tensor) -> Any:
    return TensorLeaf(t.contiguous().numpy()) if _packable(t) else t


def _unpack_leaf(leaf: TensorLeaf | np.ndarray) -> torch.Tensor | np.ndarray:
    if isinstance(leaf, np.ndarray):  # a writable one (made in-band) is the receiver's own
        return leaf if leaf.flags.writeable else leaf.copy(order="K")  # keeps its strides
    return torch.from_numpy(np.array(leaf.array, copy=True))
