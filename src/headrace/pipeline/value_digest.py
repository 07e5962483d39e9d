"""Digests of values by content, the same in every process: numbers and strings by value,
arrays and tensors by their bytes (a sample of the elements when large), containers element by
element, other objects by class and state; never through a ``repr`` that may hold a memory
address.

A callable inside a value counts by :func:`code_digest.code_identity`, which in turn hashes
the state of the objects it reaches here: the two recurse into each other, and this module
imports ``code_digest`` inside :func:`state_digest` (a local import), ``code_digest`` this one
at its top.
"""

from __future__ import annotations

import hashlib
from typing import Any

MAX_DEPTH = 6
"""Nesting levels of object state hashed; deeper state counts by its type only (numbers,
strings and arrays count by value at any depth). An object and its state take a level each, so
a ``Compose([Resize(224)])`` step reaches the 224 at level 5: object, state, list, transform,
state, value."""
MAX_ITEMS = 64
"""Elements of a list, tuple, set or dict hashed; longer ones count by length beyond that."""
_FULL_BYTES = 1 << 20
"""Arrays and tensors of up to this many bytes are hashed whole; larger ones by dtype, shape and
``_SAMPLED`` evenly spaced elements. Fingerprints are taken at every epoch's start and in every
``state_dict()``, and a step that is a bound method counts the object it is bound to: hashing a
CIFAR-10 held in memory there (150 MB) took 0.5 s a call; a change to a large array that none
of the sampled elements sees is not told apart."""
_SAMPLED = 1 << 16
"""Elements hashed of an array or tensor over ``_FULL_BYTES`` (first and last included)."""


def module_name(obj: Any) -> str:
    """``obj.__module__`` with the training script's two names (``__main__`` in the process
    that runs it, ``__mp_main__`` in a ``spawn`` child) made one."""
    mod = str(getattr(obj, "__module__", None) or "?")
    return "__main__" if mod == "__mp_main__" else mod


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a function or class, the same in every process."""
    return f"{module_name(obj)}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def short_hash(data: bytes) -> str:
    """The first 12 hex digits of the SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()[:12]


def state_digest(value: Any, depth: int = 0) -> str:
    """A digest of ``value`` by content: numbers, strings and bytes by value, arrays and
    tensors by dtype, shape and bytes (a sample of the elements over ``_FULL_BYTES``),
    containers element by element, callables by
    :func:`code_digest.code_identity`, other objects by class and ``__dict__``."""
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return short_hash(repr(value).encode())
    if isinstance(value, (bytes, bytearray, memoryview)):
        if len(value) <= _FULL_BYTES or isinstance(value, memoryview) and not value.contiguous:
            return short_hash(bytes(value))
        # a sample, as a large array's
        return short_hash(_array_bytes(np.frombuffer(value, np.uint8)))
    if isinstance(value, np.ndarray) and value.dtype.hasobject:  # elements, not pointers
        elements = state_digest(value.ravel()[:MAX_ITEMS].tolist(), depth)
        return short_hash(f"object{value.shape}:{elements}".encode())
    if isinstance(value, np.ndarray):
        return short_hash(f"{value.dtype}{value.shape}".encode() + _array_bytes(value))
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return short_hash(f"{value.dtype}{tuple(value.shape)}".encode() + _tensor_bytes(value))
    if depth >= MAX_DEPTH:
        return short_hash(qualified_name(type(value)).encode())
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
        inner = [state_digest(v, depth + 1) for v in items[:MAX_ITEMS]]
        return short_hash(f"{type(value).__name__}{len(items)}:{','.join(inner)}".encode())
    if isinstance(value, dict):
        keys = sorted(value, key=repr)[:MAX_ITEMS]
        inner = [f"{state_digest(k, depth + 1)}={state_digest(value[k], depth + 1)}" for k in keys]
        return short_hash(f"dict{len(value)}:{','.join(inner)}".encode())
    if callable(value):  # its state one level down, as any object's
        from headrace.pipeline.code_digest import code_identity  # they recurse (docstring)

        return short_hash(code_identity(value, depth).encode())
    state = getattr(value, "__dict__", None)
    name = qualified_name(type(value))
    if isinstance(state, dict):
        return short_hash(f"{name}:{state_digest(state, depth + 1)}".encode())
    rest = dictless_state(value, depth + 1)
    return short_hash(f"{name}:{rest}".encode() if rest is not None else name.encode())


def _array_bytes(a: Any) -> bytes:
    """The bytes of NumPy array ``a`` a digest hashes: all of them up to ``_FULL_BYTES``, else
    ``_SAMPLED`` evenly spaced elements (read in place, whatever the strides)."""
    import numpy as np

    if a.nbytes <= _FULL_BYTES:
        return np.ascontiguousarray(a).tobytes()
    picks = np.linspace(0, a.size - 1, _SAMPLED, dtype=np.int64)
    return b"sampled:" + a.flat[picks].tobytes()


def _tensor_bytes(t: Any) -> bytes:
    """:func:`_array_bytes` of a tensor: a CPU tensor through a NumPy view of its memory (dtypes
    NumPy lacks, such as bfloat16, as same-size integers), another device's sampled there and
    only the sample copied to the CPU."""
    import numpy as np
    import torch

    t = t.detach()
    if t.device.type == "meta":
        return b"meta"  # no values
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        return b"coo:" + _tensor_bytes(t.indices()) + b":" + _tensor_bytes(t.values())
    if t.layout != torch.strided:  # other sparse layouts: by their dense values
        t = t.to_dense()
    t = t.resolve_conj().resolve_neg()
    if t.device.type != "cpu":
        if t.numel() * t.element_size() > _FULL_BYTES:
            picks = torch.linspace(0, t.numel() - 1, _SAMPLED, device=t.device).long()
            return b"sampled:" + _tensor_bytes(t.reshape(-1)[picks].cpu())
        t = t.cpu()
    try:
        a = t.numpy()
    except TypeError:  # no NumPy dtype: its bits
        a = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
                   [t.element_size()]).numpy()
    return _array_bytes(a) if isinstance(a, np.ndarray) else b""


def dictless_state(value: Any, depth: int) -> str | None:
    """A digest of the state of an object without a ``__dict__``, hashed at ``depth`` as a
    ``__dict__`` would be: its ``__slots__``' values, else what pickle rebuilds it from
    (``__reduce_ex__``: a name for ``torch.float16``, constructor arguments for a
    ``pathlib.Path``, ``datetime.date``, NumPy scalar, ``torch.device`` or
    ``operator.itemgetter``). ``None`` when neither can be read: the object then counts by its
    type only."""
    slots: dict[str, Any] = {}
    for cls in type(value).__mro__:
        names = cls.__dict__.get("__slots__", ())
        for n in (names,) if isinstance(names, str) else names:
            if n.startswith("__") and not n.endswith("__"):  # a private name, mangled
                n = f"_{cls.__name__.lstrip('_')}{n}"
            if n not in ("__dict__", "__weakref__") and n not in slots and hasattr(value, n):
                slots[n] = getattr(value, n)
    if slots:
        return state_digest(slots, depth)
    try:
        reduced = value.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 - not picklable: nothing to read its state from
        return None
    if isinstance(reduced, str):  # a module-level object, pickled by its name
        return short_hash(reduced.encode())
    if isinstance(reduced, tuple) and len(reduced) >= 2:
        args = state_digest(reduced[1], depth)
        extra = state_digest(reduced[2], depth) if len(reduced) > 2 else "-"
        return short_hash(f"{args}:{extra}".encode())
    return None
