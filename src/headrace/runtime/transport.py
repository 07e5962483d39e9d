"""Hand-off payloads (and leaves too large for a worker's ring) between processes.

Finished samples travel through each worker's ring (``runtime/ring.py``). What is left — a
slow-lane sample's partial value sent to the next worker, a leaf over a quarter of a ring — goes
here: leaves up to ``INLINE_LIMIT`` are pickled inline; larger ones travel through shared memory
by torch's reductions (the receiver maps the same pages). A shared-memory descriptor costs about
0.7 ms of receiver CPU and several ms of latency (a socket handshake); pickling 256 KB inline
costs about 0.12 ms, so only really large leaves are worth a descriptor. ``encode`` runs in the
sender, ``decode`` in the receiver.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

INLINE_LIMIT = 1024 * 1024
"""Leaves smaller than this many bytes are pickled inline; larger ones go through shared memory."""


class _Shm:
    """A NumPy array or bytes object carried as a shared-memory tensor."""

    __slots__ = ("kind", "tensor")

    def __init__(self, kind: str, tensor: torch.Tensor) -> None:
        self.kind = kind
        self.tensor = tensor

    def __reduce__(self):
        return (_Shm, (self.kind, self.tensor))


class _Inline:
    """A small tensor pickled by value (as an array) instead of by shared-memory descriptor."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self):
        return (_Inline, (self.array,))


class _View:
    """A conjugate or negative view carried as its stored values and its two bits, which
    torch's pickling drops (a ``x.conj()`` sample arrived conjugated back: its values changed).
    The receiver makes the same view again (:func:`decode`)."""

    __slots__ = ("conj", "neg", "tensor")

    def __init__(self, tensor: Any, conj: bool, neg: bool) -> None:
        self.tensor = tensor
        self.conj = conj
        self.neg = neg

    def __reduce__(self):
        return (_View, (self.tensor, self.conj, self.neg))


def plain_tensor(x: Any) -> bool:
    """``x`` is a CPU ``torch.Tensor`` that travels as its bytes alone: not a subclass (whose
    type and attributes, e.g. a bounding box's format, pickling keeps), not one that requires
    grad (an ``nn.Parameter``), strided. Its NumPy view may still fail (float8, complex32, a
    conjugate view): callers fall back to pickling it."""
    return (type(x) is torch.Tensor and x.layout == torch.strided and x.device.type == "cpu"
            and not x.requires_grad)


def encode(x: Any) -> Any:
    """Replace large arrays/bytes in a (nested) sample by shared-memory carriers."""
    if isinstance(x, torch.Tensor):
        if not plain_tensor(x):
            return x  # torch's own pickling keeps what the bytes alone would lose
        conj, neg = x.is_conj(), x.is_neg()
        if conj or neg:  # the view's bits off: the values as stored
            return _View(encode(torch._neg_view(x.conj() if conj else x) if neg
                                else x.conj()), conj, neg)
        nbytes = x.numel() * x.element_size()
        if nbytes < INLINE_LIMIT and x.dtype != torch.bfloat16:
            try:
                return _Inline(x.contiguous().numpy())  # skip torch's descriptor passing
            except (TypeError, RuntimeError):  # no NumPy dtype (float8), a conjugate view
                return x
        if x.untyped_storage().nbytes() > 2 * nbytes:
            # a view of a larger tensor (``self.data[i]``): torch would move the whole
            # storage to shared memory, once per worker; send only the view's bytes
            return x.clone()
        return x
    if type(x) is np.ndarray:  # a subclass (np.matrix, a masked array) pickles as itself
        if x.nbytes >= INLINE_LIMIT and x.dtype != object and x.dtype.kind in "biufc":
            if not x.flags.writeable:  # e.g. np.asarray(PIL image); torch wants writable memory
                x = np.array(x)  # the copy into shared memory happens anyway
            return _Shm("np", torch.from_numpy(np.ascontiguousarray(x)))
        return x
    if isinstance(x, (bytes, bytearray)):
        if len(x) >= INLINE_LIMIT:
            kind = "bytes" if isinstance(x, bytes) else "bytearray"
            return _Shm(kind, torch.frombuffer(bytearray(x), dtype=torch.uint8))
        return x
    return _map_containers(x, encode)


def decode(x: Any) -> Any:
    """Inverse of :func:`encode`, run in the receiving process (zero-copy for arrays)."""
    if isinstance(x, _Inline):
        return torch.from_numpy(x.array)
    if isinstance(x, _View):
        t = decode(x.tensor)
        t = torch._neg_view(t) if x.neg else t
        return t.conj() if x.conj else t
    if isinstance(x, _Shm):
        if x.kind == "np":
            return x.tensor.numpy()
        data = x.tensor.numpy().tobytes()
        return data if x.kind == "bytes" else bytearray(data)
    if isinstance(x, (torch.Tensor, np.ndarray, bytes, str, int, float)) or x is None:
        return x
    return _map_containers(x, decode)


def _map_containers(x: Any, f: Any) -> Any:
    """``x`` with ``f`` applied to the items of its dicts, lists, tuples and namedtuples, each
    container of the same type again: a dict subclass is copied and updated (a
    ``defaultdict`` keeps its factory, as torch's ``default_collate`` keeps it), a list or
    tuple subclass (``torch.return_types.max``) is left whole, pickled as itself."""
    t = type(x)
    if t is dict:
        return {k: f(v) for k, v in x.items()}
    if t is list:
        return [f(v) for v in x]
    if t is tuple:
        return tuple(f(v) for v in x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return t(*(f(v) for v in x))
    if isinstance(x, dict):
        try:
            clone = copy.copy(x)
            clone.update({k: f(v) for k, v in x.items()})
            return clone
        except Exception:  # noqa: BLE001 - a mapping that will not copy: sent whole
            return x
    return x
