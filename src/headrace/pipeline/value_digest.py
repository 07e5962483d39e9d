"""Digests of values by content, the same in every process: numbers and strings by value,
arrays and tensors by their bytes, containers element by element, other objects by class and
state; never through a ``repr`` that may hold a memory address.

What is hashed in full, and what beyond a bound. The values hashed here are a step's
parameters (bound arguments, captured values, defaults, a callable object's state), the module
globals it reads by value, and a source's state (for the sample cache). Digests are taken at
every epoch's start and in every ``state_dict()``, not per sample; each bound below is where
hashing everything cost more than about 50 ms on 2 shared cores (docs/design.md, "a value
differing anywhere"):

- a list, tuple, set or dict: every item, up to ``FULL_ITEMS`` items of any kind,
  ``_FULL_RECORDS`` tuples of plain scalars (records such as ``(path, label)``) and
  ``_FULL_SCALARS`` plain scalars (``None``, ``bool``, ``int``, ``float``, ``complex``,
  ``str``, ``bytes``); records and scalars are hashed in one pass, at C speed. Beyond (or once
  ``TOTAL_ITEMS`` is spent), for the sample cache's keys, all items in one pass if they are
  plain values at any depth (``plain_digest``, up to ``TOTAL_PLAIN``); else evenly spaced items and the length, and the
  digest is incomplete (below). A set's items, and a dict's keys up to ``_SORTED``, are sorted
  first (a set of strings iterates in an order string hashing, seeded anew in each process,
  decides); a larger dict counts in insertion order.
- an array, a tensor, ``bytes``: every byte up to ``_FULL_BYTES``; beyond, ``_SAMPLED``
  evenly spaced elements, with dtype and shape. A larger array mapped from a file
  (``np.memmap``, ``np.load(mmap_mode=...)``) is data a source reads, not a parameter: it
  counts by the file's path, the view's place in it, strides, and the file's size and
  modification time (``sources.Files``' rule), and none of it is read.

- one digest as a whole (the outermost :func:`state_digest` or ``code_identity`` call and
  all it reaches, ``digest_scope.digest_scope``): ``TOTAL_BYTES`` hashed in full,
  ``TOTAL_ITEMS`` items hashed one by one and ``TOTAL_PLAIN`` bytes of plain values, for the
  bounds above compounded; past them, a few elements of an array or items of a container.

Containers of up to ``MAX_ITEMS`` items are hashed item by item, and arrays of up to 1 MiB
whole, as in every earlier version: their digests did not change when the rest stopped being
cut at 64 items and sampled past 1 MiB (``identity_version`` 5).

State is followed at any depth: a cycle back to an object on the path being hashed counts by
its distance up that path, and nothing is left out by its depth alone. Before, state nested
more than 6 levels deep counted by its type only, and two jobs whose step held
``partial(prep, t=Compose([Resize(224)]))`` and ``Resize(256)``, or a nested ``nn.Sequential``
with other weights, shared a Redis cache's entries (one was served the other's samples). What
cannot be followed whole (nested more than ``MAX_NESTING`` objects deep, more than
``TOTAL_NODES`` objects, a container's items sampled, a ``RecursionError``) is not cut
silently: the digest records it (``digest_scope.Findings`` ``cut``), and the sample cache keys
no form by it (``cache/tiers.py``); an array's bytes sampled past a byte bound are not
recorded (a change few of its elements see is not told apart). A
random generator (``random.Random``, NumPy's ``Generator``, ``RandomState`` and
``BitGenerator``, ``torch.Generator``) counts by its type, not its state (what it drew so
far), and is recorded too (``generator``): a step holding one may draw from it.

A callable inside a value counts by :func:`code_digest.code_identity`, which in turn hashes
the state of the objects it reaches here: the two recurse into each other, and this module
imports ``code_digest`` inside :func:`state_digest` (a local import), ``code_digest`` this one
at its top. Both take part in one whole digest (``digest_scope.digest_scope``).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import logging
import os
import pickle
from itertools import chain
from typing import Any

from headrace.pipeline.digest_scope import (
    CODE_ONLY,
    TOTAL_ITEMS,
    digest_scope,
    generator_kind,
    guarded,
    note_cut,
    note_generator,
    on_path,
    qualified_name,
    running,
    short_hash,
    spend,
    wants_complete,
)
from headrace.pipeline.modules import module_digest
from headrace.pipeline.plain_digest import kinds_in_words, plain_digest

MAX_ITEMS = 64
"""Containers of up to this many items are hashed item by item, each item's digest joined
(the format of every earlier version); longer ones by :func:`_items_digest`. Before
``identity_version`` 5 the items past this many were not hashed at all: two jobs whose decode
step held a 100-entry lookup table differing at entry 90 shared a Redis cache's entries, and
one was served the other's samples (a bug hunt)."""
FULL_ITEMS = 1 << 13
"""Items of a container hashed one by one (each by :func:`state_digest`) when they are not
plain scalars or records (below); a longer one counts by this many evenly spaced items and its
length. 8,192 objects of two attributes took 60 ms, 8,192 arrays of 1 KB 45 ms."""
_FULL_SCALARS = 1 << 20
"""Items of a container of plain scalars hashed in one pass (pickled without a memo: at C
speed, equal values give equal bytes); a longer one counts by ``_SAMPLED`` evenly spaced items
and its length. A list of a million floats or strings took 40 ms (half of it checking their
types)."""
_FULL_RECORDS = 1 << 18
"""Items of a container of tuples of plain scalars (records: ``(path, label)``) hashed in one
pass; a longer one counts by ``FULL_ITEMS`` evenly spaced records and its length. 262,144
records of a path and a label took 45 ms (checking their types is half of it), ImageNet's 1.28
million took 0.2 s."""
_SORTED = 1 << 16
"""Keys of a dict sorted before hashing (equal dicts built in another order, equal digests);
a larger dict counts its items in insertion order: sorting a million random keys took 0.35 s.
Sets are always sorted (their order differs between processes)."""
_FULL_BYTES = 64 << 20
"""Arrays, tensors and ``bytes`` of up to this many bytes are hashed whole (SHA-256: about
1.5 GB/s here, BLAKE2b 0.9 GB/s; 64 MiB took 43 ms). Larger ones count by dtype, shape and
``_SAMPLED`` evenly spaced elements, or, mapped from a file, by the file (module docstring):
a dataset held in memory may be reached through a bound method's object or a source's state,
and a 1 GB array took 0.7 s to hash whole; a change to such an array that none of the sampled
elements sees is not told apart."""
_SAMPLED = 1 << 18
"""Elements hashed of an array or tensor over ``_FULL_BYTES``, and items of a container of
scalars over ``_FULL_SCALARS``, first and last included: one every 4 KB of a 1 GB ``uint8``
array, read in 8 ms."""
_CHUNK = 4 << 20
"""Bytes of a non-contiguous array copied at a time to be hashed."""
_SPENT_SAMPLE = 64
"""Elements (items) hashed of an array (container) met once the digest's budget is spent."""
SCALAR_TYPES = frozenset({type(None), bool, int, float, complex, str, bytes})
"""Types hashed in one pass when a container holds only them (exact types: a subclass such as
an ``IntEnum`` may carry state)."""


def state_digest(value: Any, depth: int = 0) -> str:
    """A digest of ``value`` by content: numbers, strings and bytes by value, arrays and
    tensors by dtype, shape and bytes, containers element by element (the bounds past which
    they are sampled: module docstring; over the whole digest, ``TOTAL_BYTES`` and
    ``TOTAL_ITEMS``), callables by :func:`code_digest.code_identity`, other objects by class
    and ``__dict__``, at any depth (module docstring). ``depth`` 0: the step itself (its
    globals count, ``code_identity``); ``CODE_ONLY``: state by type."""
    if running():
        return _state_digest(value, depth)
    with digest_scope():
        return guarded(_state_digest, value, depth)


def _state_digest(value: Any, depth: int) -> str:
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return short_hash(repr(value).encode())
    if isinstance(value, (bytes, bytearray, memoryview)):
        if isinstance(value, memoryview) and not value.contiguous:
            return short_hash(bytes(value))
        size = value.nbytes if isinstance(value, memoryview) else len(value)
        if size <= _FULL_BYTES and spend(size):
            return hashlib.sha256(value).hexdigest()[:12]
        h = hashlib.sha256()  # a sample, as a large array's
        _hash_array(h, np.frombuffer(value, np.uint8))
        return h.hexdigest()[:12]
    if isinstance(value, np.ndarray) and value.dtype.hasobject:  # elements, not pointers
        elements = state_digest(value.ravel().tolist(), depth)
        return short_hash(f"object{value.shape}:{elements}".encode())
    if isinstance(value, np.ndarray):
        h = hashlib.sha256(f"{value.dtype}{value.shape}".encode())
        _hash_array(h, value)
        return h.hexdigest()[:12]
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        h = hashlib.sha256(f"{value.dtype}{tuple(value.shape)}".encode())
        _hash_tensor(h, value)
        return h.hexdigest()[:12]
    if depth >= CODE_ONLY:
        return short_hash(qualified_name(type(value)).encode())
    kind = generator_kind(value)
    if kind is not None:  # by its type: its state is what it drew so far
        note_generator(kind)
        return short_hash(f"generator:{kind}".encode())
    if inspect.ismodule(value):  # by its source file, as a module a step calls into
        return short_hash(f"module:{module_digest(value)}".encode())
    if isinstance(value, logging.Logger):  # by name: its manager reaches every logger
        return short_hash(f"logger:{value.name}".encode())
    if callable(value):  # its state one level down, as any object's (code_identity enters it)
        from headrace.pipeline.code_digest import code_identity  # they recurse (docstring)

        return short_hash(code_identity(value, depth).encode())
    return on_path(value, _object_digest, depth)


def _object_digest(value: Any, depth: int) -> str:
    """:func:`_state_digest` of a container or an object without code (on the path)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        name = type(value).__name__
        if len(value) <= MAX_ITEMS:
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            inner = [state_digest(v, depth + 1) for v in items]
            return short_hash(f"{name}{len(value)}:{','.join(inner)}".encode())
        items = _sorted(value) if isinstance(value, (set, frozenset)) else value
        return short_hash(f"{name}{len(value)}:{_items_digest(items, depth + 1)}".encode())
    if isinstance(value, dict):
        if len(value) <= MAX_ITEMS:
            keys = sorted(value, key=repr)
            inner = [f"{state_digest(k, depth + 1)}={state_digest(value[k], depth + 1)}"
                     for k in keys]
            return short_hash(f"dict{len(value)}:{','.join(inner)}".encode())
        if len(value) <= _SORTED:
            keys = _sorted(value)
            values = [value[k] for k in keys]
        else:
            keys, values = list(value), list(value.values())
        return short_hash(f"dict{len(value)}:{_items_digest(keys, depth + 1)}="
                          f"{_items_digest(values, depth + 1)}".encode())
    state = getattr(value, "__dict__", None)
    name = qualified_name(type(value))
    if isinstance(state, dict):
        return short_hash(f"{name}:{state_digest(state, depth + 1)}".encode())
    rest = dictless_state(value, depth + 1)
    return short_hash(f"{name}:{rest}".encode() if rest is not None else name.encode())


def _sorted(items: Any) -> list[Any]:
    """``items`` in an order the same in every process: by value when all are ints, all
    strings or all bytes (fast), else by ``repr``."""
    kinds = set(map(type, items))
    if len(kinds) == 1 and kinds <= {int, str, bytes}:
        return sorted(items)
    return sorted(items, key=repr)


def _items_digest(items: Any, depth: int) -> str:
    """A digest of a sequence's items, in order. Plain scalars: all in one pass, up to
    ``_FULL_SCALARS``. Tuples of plain scalars (records: ``(path, label)``): all in one pass,
    up to ``_FULL_RECORDS``. Others: each by :func:`state_digest` at ``depth``, up to
    ``FULL_ITEMS`` and while the digest's ``TOTAL_ITEMS`` last. Beyond: all in one pass when
    they are plain values (``plain_digest``), else evenly spaced ones (``FULL_ITEMS``,
    ``_SAMPLED`` scalars, or 64 once ``TOTAL_ITEMS`` is spent) and the digest is incomplete
    (``note_cut``: the sample cache keys no form by it)."""
    import numpy as np

    n, prefix = len(items), ""
    kinds = set(map(type, items))
    flat = kinds <= SCALAR_TYPES or kinds == {tuple} and n <= _FULL_RECORDS and _records(items)
    if n <= (_FULL_SCALARS if flat else FULL_ITEMS) and (flat or spend(items=n)):
        return _hashed(items, flat, prefix, depth)
    whole = plain_digest(items if type(items) in (list, tuple) else list(items)) \
        if wants_complete() else None
    if whole is not None:
        return f"plain:{whole}"
    limit = _FULL_SCALARS if flat else FULL_ITEMS
    why = (f"more than {limit:,}" if n > limit
           else f"past the {TOTAL_ITEMS:,} hashed one by one over the whole digest")
    if n > limit:
        picks = np.linspace(0, n - 1, _SAMPLED if flat else FULL_ITEMS, dtype=np.int64)
        items, prefix = [items[i] for i in picks.tolist()], "sampled:"
        flat = flat or set(map(type, items)) == {tuple} and _records(items)
    if not flat and not spend(items=len(items)):  # the digest's item budget is spent
        picks = np.linspace(0, len(items) - 1, _SPENT_SAMPLE, dtype=np.int64)
        items, prefix = [items[i] for i in picks.tolist()], prefix + "spent:"
    plain = "; not all plain values" if wants_complete() else ""  # too many: noted already
    note_cut(f"a container of {n:,} items of {kinds_in_words(kinds)} ({why}{plain}) was hashed "
             f"by a sample of {len(items):,}")
    return _hashed(items, flat, prefix, depth)


def _hashed(items: Any, flat: bool, prefix: str, depth: int) -> str:
    """The digest of all of ``items``: in one pass if ``flat`` (plain scalars or records),
    else each by :func:`state_digest` at ``depth``."""
    if flat:
        buf = io.BytesIO()
        pickler = pickle.Pickler(buf, 4)
        pickler.fast = True  # no memo: the bytes follow the values, not which objects repeat
        pickler.dump(items if type(items) in (list, tuple) else list(items))
        return f"{prefix}scalars:{hashlib.sha256(buf.getbuffer()).hexdigest()[:12]}"
    return prefix + short_hash(",".join(state_digest(v, depth) for v in items).encode())


def _records(items: Any) -> bool:
    """Whether the tuples ``items`` hold only plain scalars."""
    return set(map(type, chain.from_iterable(items))) <= SCALAR_TYPES


def _hash_array(h: Any, a: Any) -> None:
    """Feed hasher ``h`` the bytes of NumPy array ``a`` (C order, whatever its strides): all
    of them up to ``_FULL_BYTES``, else the file it is mapped from (:func:`_mapped_file`) or
    ``_SAMPLED`` evenly spaced elements (read in place)."""
    import numpy as np

    if a.nbytes <= _FULL_BYTES and spend(a.nbytes):
        if a.flags.c_contiguous:
            h.update(a.reshape(-1).view(np.uint8))
            return
        step = max(1, _CHUNK // max(1, a.nbytes // a.shape[0]))  # rows at a time
        for i in range(0, a.shape[0], step):
            h.update(np.ascontiguousarray(a[i:i + step]).reshape(-1).view(np.uint8))
        return
    mapped = _mapped_file(a)
    if mapped is not None:
        h.update(b"mapped:" + mapped.encode())
        return
    if a.size == 0:
        h.update(b"empty")
        return
    if a.nbytes <= _FULL_BYTES:  # the digest's budget is spent: a few elements, last included
        h.update(b"spent:" + a.flat[::max(1, a.size // _SPENT_SAMPLE)].tobytes()
                 + a.flat[-1:].tobytes())
        return
    picks = np.linspace(0, a.size - 1, _SAMPLED, dtype=np.int64)
    h.update(b"sampled:" + a.flat[picks].tobytes())


def _mapped_file(a: Any) -> str | None:
    """Where array ``a`` lies in the file it is mapped from (it or an array it views is an
    ``np.memmap``): path, byte offset of its first element, strides, and the file's size and
    modification time (ns); ``None`` when not mapped, or the file is gone."""
    import mmap

    import numpy as np

    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not (isinstance(root, np.memmap) and isinstance(root.base, mmap.mmap)
            and root.filename):
        return None
    start = (root.offset + a.__array_interface__["data"][0]
             - root.__array_interface__["data"][0])
    try:
        st = os.stat(root.filename)
    except OSError:
        return None
    return f"{root.filename}:{start}:{a.strides}:{st.st_size}:{st.st_mtime_ns}"


def _hash_tensor(h: Any, t: Any) -> None:
    """:func:`_hash_array` of a tensor: a CPU tensor through a NumPy view of its memory (dtypes
    NumPy lacks, such as bfloat16, as same-size integers), another device's sampled there over
    ``_FULL_BYTES`` and only the sample copied to the CPU."""
    import numpy as np
    import torch

    t = t.detach()
    if t.device.type == "meta":
        h.update(b"meta")  # no values
        return
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        h.update(b"coo:")
        _hash_tensor(h, t.indices())
        h.update(b":")
        _hash_tensor(h, t.values())
        return
    if t.layout != torch.strided:  # other sparse layouts: by their dense values
        t = t.to_dense()
    t = t.resolve_conj().resolve_neg()
    if t.device.type != "cpu":
        if t.numel() * t.element_size() > _FULL_BYTES:
            picks = torch.linspace(0, t.numel() - 1, _SAMPLED, device=t.device).long()
            h.update(b"sampled:")
            _hash_tensor(h, t.reshape(-1)[picks].cpu())
            return
        t = t.cpu()
    try:
        a = t.numpy()
    except TypeError:  # no NumPy dtype: its bits
        a = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
                   [t.element_size()]).numpy()
    if isinstance(a, np.ndarray):
        _hash_array(h, a)


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
