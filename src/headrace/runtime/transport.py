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


def encode(x: Any) -> Any:
    """Replace large arrays/bytes in a (nested) sample by shared-memory carriers."""
    if isinstance(x, torch.Tensor):
        if x.device.type == "cpu" and x.layout == torch.strided and \
                x.numel() * x.element_size() < INLINE_LIMIT and x.dtype != torch.bfloat16:
            return _Inline(x.detach().contiguous().numpy())  # skip torch's descriptor passing
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
