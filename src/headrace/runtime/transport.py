"""Hand-off payloads (and leaves too large for a worker's ring) between processes.

Finished samples travel through each worker's ring (``runtime/ring.py``). What is left — a
slow-lane sample's partial value sent to the next worker, a leaf over a quarter of a ring — goes
here: leaves up to ``INLINE_LIMIT`` are pickled inline; larger ones travel through shared memory
by torch's reductions (the receiver maps the same pages), always as a fresh shared copy: torch's
reductions move the storage of the tensor they are given to shared memory in place, so a
tensor the sender keeps (a dataset's preloaded sample, a buffer it fills again for the next
index) would become one the receiver reads while the sender writes it, and a shared-memory
segment and a file descriptor for as long as the sender keeps it. Tensors whose dtype NumPy
lacks (bfloat16, float8, complex32) travel as an integer view of their bits
(:func:`numpy_bits`) and are viewed back on receipt; NumPy arrays whose dtype torch refuses
(another byte order than the machine's, ``longdouble``) travel as their bytes, likewise. A
shared-memory descriptor costs about 0.7 ms of receiver CPU and several ms of latency (a socket
handshake); pickling 256 KB inline costs about 0.12 ms, so only really large leaves are worth a
descriptor. ``encode`` runs in the sender, ``decode`` in the receiver; a value that ``encode``
still cannot carry fails its sample, not its worker (``outbox.unsendable``).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

INLINE_LIMIT = 1024 * 1024
"""Leaves smaller than this many bytes are pickled inline; larger ones go through shared memory."""


class _Shm:
    """A NumPy array or bytes object carried as a shared-memory tensor. ``dtype`` and
    ``shape``: an array's own where the tensor holds its bytes (a dtype torch refuses:
    :func:`_torch_takes`), else None."""

    __slots__ = ("dtype", "kind", "shape", "tensor")

    def __init__(self, kind: str, tensor: torch.Tensor, dtype: np.dtype | None = None,
                 shape: tuple[int, ...] | None = None) -> None:
        self.kind = kind
        self.tensor = tensor
        self.dtype = dtype
        self.shape = shape

    def __reduce__(self):
        return (_Shm, (self.kind, self.tensor, self.dtype, self.shape))


class _Inline:
    """A small tensor pickled by value (as an array) instead of by shared-memory descriptor;
    ``dtype``: the tensor's own where the array holds its bits (:func:`numpy_bits`), else None."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: np.ndarray, dtype: torch.dtype | None = None) -> None:
        self.array = array
        self.dtype = dtype

    def __reduce__(self):
        return (_Inline, (self.array, self.dtype))


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


class _Flipped:
    """A NumPy array with negative strides, carried as its values with those axes flipped back
    (``array``, encoded) and the ``axes``: pickling or the ring would give the receiver a
    contiguous copy, which ``default_collate`` stacks, where torch (and ``num_workers=0``)
    raise ``ValueError`` (``torch.as_tensor`` refuses negative strides)."""

    __slots__ = ("array", "axes")

    def __init__(self, array: Any, axes: tuple[int, ...]) -> None:
        self.array = array
        self.axes = axes

    def __reduce__(self):
        return (_Flipped, (self.array, self.axes))


def negative_axes(x: np.ndarray) -> tuple[int, ...]:
    """The axes along which ``x`` steps backwards in memory (``x[::-1]``)."""
    return tuple(i for i, st in enumerate(x.strides) if st < 0)


def steps_back(x: np.ndarray) -> bool:
    """Whether ``x`` has a negative stride (:func:`negative_axes` is not empty), in about half
    its time. Not NumPy's C-contiguous flag: an array whose negative stride is along an axis of
    size 1 is flagged contiguous, and torch refuses it all the same (a review)."""
    s = x.strides
    return bool(s) and min(s) < 0


def plain_tensor(x: Any) -> bool:
    """``x`` is a CPU ``torch.Tensor`` that travels as its bytes alone: not a subclass (whose
    type and attributes, e.g. a bounding box's format, pickling keeps), not one that requires
    grad (an ``nn.Parameter``), strided. Its NumPy view may still fail (float8, complex32, a
    conjugate view): callers fall back to pickling it."""
    return (type(x) is torch.Tensor and x.layout == torch.strided and x.device.type == "cpu"
            and not x.requires_grad)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
"""The integer dtype of each element size in bytes, for dtypes NumPy lacks."""
_HAS_NUMPY: dict[torch.dtype, bool] = {}
"""Whether a dtype has a NumPy one, learned once per dtype: a failed ``numpy()`` costs 10 us
(its exception), several times a CIFAR image's whole trip through the ring."""


def _has_numpy(dtype: torch.dtype) -> bool:
    ok = _HAS_NUMPY.get(dtype)
    if ok is None:
        try:
            torch.empty(0, dtype=dtype).numpy()
            ok = True
        except Exception:  # noqa: BLE001 - no NumPy dtype (or not even an empty tensor)
            ok = False
        _HAS_NUMPY[dtype] = ok
    return ok


_TORCH_TAKES: dict[np.dtype, bool] = {}
"""Whether ``torch.from_numpy`` takes arrays of a NumPy dtype, learned once per dtype."""


def _torch_takes(dtype: np.dtype) -> bool:
    """Whether ``torch.from_numpy`` takes an array of ``dtype``: not one in a byte order other
    than the machine's (``">f8"``, as FITS and other big-endian files hold), not ``longdouble``
    or ``clongdouble``; such arrays cross as their bytes (:func:`_bytes_of`)."""
    ok = _TORCH_TAKES.get(dtype)
    if ok is None:
        try:
            torch.from_numpy(np.empty(0, dtype=dtype))
            ok = True
        except (TypeError, ValueError, RuntimeError):
            ok = False
        _TORCH_TAKES[dtype] = ok
    return ok


def _bytes_of(x: np.ndarray) -> np.ndarray:
    """``x``'s values in C order as a flat ``uint8`` array: a view where ``x`` is
    C-contiguous, else one copy. ``decode`` views them back as ``x``'s dtype and shape."""
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def numpy_bits(x: torch.Tensor) -> tuple[np.ndarray, torch.dtype | None] | None:
    """A C-contiguous NumPy array of plain tensor ``x``'s values, and None; for a dtype NumPy
    lacks (bfloat16, float8, complex32), an integer array of the same element size holding
    its bits, and ``x``'s dtype to view them back with (``torch.from_numpy(a).view(dtype)``,
    bit for bit). None where neither works (a quantized tensor, whose scale a view drops; a
    conjugate or negative view)."""
    if x.is_conj() or x.is_neg():
        return None
    bits = None if _has_numpy(x.dtype) else _BITS.get(x.element_size())
    try:
        if bits is None:
            return x.contiguous().numpy(), None
        if not x.is_quantized:
            return x.contiguous().view(bits).numpy(), x.dtype
    except (TypeError, RuntimeError):
        pass
    return None


def _own(a: np.ndarray, x: torch.Tensor) -> np.ndarray:
    """``a`` (:func:`numpy_bits` of ``x``), copied where it is ``x``'s own memory: a message
    is pickled when it is sent, which may be after the sender filled ``x`` again (a dataset
    that returns one buffer for every index)."""
    return a.copy() if x.is_contiguous() else a


def shared_copy(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of plain tensor ``x`` in a new shared-memory storage, which torch's
    reductions send as it is (one copy, the one ``share_memory_()`` would make of ``x``'s
    storage, moving the sender's own storage to shared memory in place). Only ``x``'s bytes
    are copied, not a larger storage it views. Where torch will not make one (a quantized
    tensor), a private clone, which those reductions then move."""
    try:
        storage = torch.UntypedStorage._new_shared(x.numel() * x.element_size())
        y = torch.empty(0, dtype=x.dtype).set_(storage).view(x.shape)
        return y.copy_(x)
    except (TypeError, RuntimeError):
        return x.clone()


def _private_copy(x: torch.Tensor) -> torch.Tensor:
    """A deep copy of a CPU tensor that is not plain (a subclass with its attributes, an
    ``nn.Parameter``, one that requires grad), for torch's pickling to move to shared memory
    instead of ``x``'s own storage (two copies: such tensors are rare in samples). ``x``
    itself where torch shares nothing (another device) or will not copy it (a tensor made by
    an autograd graph, which torch refuses to send anyway)."""
    if x.device.type != "cpu" or x.layout != torch.strided or x.grad_fn is not None:
        return x
    try:
        return copy.deepcopy(x)
    except Exception:  # noqa: BLE001 - a subclass that will not copy: sent as before
        return x


def encode(x: Any) -> Any:
    """Replace large arrays/bytes in a (nested) sample by shared-memory carriers."""
    if isinstance(x, torch.Tensor):
        if not plain_tensor(x):  # torch's own pickling keeps what the bytes alone would lose
            return _private_copy(x)
        conj, neg = x.is_conj(), x.is_neg()
        if conj or neg:  # the view's bits off: the values as stored
            return _View(encode(torch._neg_view(x.conj() if conj else x) if neg
                                else x.conj()), conj, neg)
        if x.numel() * x.element_size() < INLINE_LIMIT:
            bits = numpy_bits(x)
            if bits is not None:  # skip torch's descriptor passing
                return _Inline(_own(bits[0], x), bits[1])
        # never ``x`` itself: torch would move its storage (all of it, for a view of a
        # larger tensor such as ``self.data[i]``) to shared memory in place
        return shared_copy(x)
    if type(x) is np.ndarray:  # a subclass (np.matrix, a masked array) pickles as itself
        if steps_back(x):
            axes = negative_axes(x)
            return _Flipped(encode(np.flip(x, axes)), axes)
        if x.nbytes >= INLINE_LIMIT and x.dtype != object and x.dtype.kind in "biufc":
            # its bytes where torch refuses its dtype (which failed the sample's worker)
            a, dtype = (x, None) if _torch_takes(x.dtype) else (_bytes_of(x), x.dtype)
            shape = None if dtype is None else x.shape
            if not a.flags.writeable:  # e.g. np.asarray(PIL image); torch wants writable memory
                # a private copy: torch may move it
                return _Shm("np", torch.from_numpy(np.array(a)), dtype, shape)
            # a fresh shared copy, as for a tensor: torch's reductions would otherwise move
            # (or, already shared, hand over) memory the sender keeps and may fill again
            # (one copy, strided too; two for a strided array whose dtype torch refuses)
            return _Shm("np", shared_copy(torch.from_numpy(a)), dtype, shape)
        # pickled when its message is sent, which may be after the sender filled it again
        return x if x.dtype == object else x.copy(order="K")
    if isinstance(x, (bytes, bytearray)):
        if len(x) >= INLINE_LIMIT:
            kind = "bytes" if isinstance(x, bytes) else "bytearray"
            return _Shm(kind, torch.frombuffer(bytearray(x), dtype=torch.uint8))
        return bytearray(x) if type(x) is bytearray else x
    return _map_containers(x, encode)


def decode(x: Any) -> Any:
    """Inverse of :func:`encode`, run in the receiving process (zero-copy for arrays)."""
    if isinstance(x, _Inline):
        t = torch.from_numpy(x.array)
        return t if x.dtype is None else t.view(x.dtype)
    if isinstance(x, _View):
        t = decode(x.tensor)
        t = torch._neg_view(t) if x.neg else t
        return t.conj() if x.conj else t
    if isinstance(x, _Flipped):
        return np.flip(decode(x.array), x.axes)
    if isinstance(x, _Shm):
        if x.kind == "np":
            a = x.tensor.numpy()
            return a if x.dtype is None else a.view(x.dtype).reshape(x.shape)
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
