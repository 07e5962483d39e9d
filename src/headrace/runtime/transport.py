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
    if isinstance(x, np.ndarray):
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
    if isinstance(x, dict):
        return {k: encode(v) for k, v in x.items()} if type(x) is dict else _map_dict(x, encode)
    if isinstance(x, tuple):
        if hasattr(x, "_fields"):  # namedtuple
            return type(x)(*(encode(v) for v in x))
        return tuple(encode(v) for v in x)
    if isinstance(x, list):
        return [encode(v) for v in x]
    return x


def decode(x: Any) -> Any:
    """Inverse of :func:`encode`, run in the receiving process (zero-copy for arrays)."""
    if isinstance(x, _Inline):
        return torch.from_numpy(x.array)
    if isinstance(x, _Shm):
        if x.kind == "np":
            return x.tensor.numpy()
        data = x.tensor.numpy().tobytes()
        return data if x.kind == "bytes" else bytearray(data)
    if isinstance(x, (torch.Tensor, np.ndarray, bytes, str, int, float)) or x is None:
        return x
    if isinstance(x, dict):
        return {k: decode(v) for k, v in x.items()} if type(x) is dict else _map_dict(x, decode)
    if isinstance(x, tuple):
        if hasattr(x, "_fields"):
            return type(x)(*(decode(v) for v in x))
        return tuple(decode(v) for v in x)
    if isinstance(x, list):
        return [decode(v) for v in x]
    return x


def _map_dict(d: Any, f: Any) -> Any:
    try:
        return type(d)({k: f(v) for k, v in d.items()})
    except TypeError:
        return {k: f(v) for k, v in d.items()}
