"""A per-worker shared-memory ring: how finished samples reach the training process.

Passing a shared-memory descriptor per tensor (torch's way, made for one batch at a time) costs
about 0.7 ms of training-process CPU and several ms of latency per tensor: a socket handshake
per descriptor. Samples travel one by one here, so each worker gets one ring, mapped once by
both sides. The worker copies each large array of a finished sample into its ring and sends only
(offset, dtype, shape) through its pipe; the training process copies it out (about 0.1 ms per
MB) as soon as the message arrives and frees the space. One producer (the worker), one consumer
(the scheduler thread), messages read in order: a monotonic count of bytes written, kept by the
worker and sent with each message, and a shared read position the consumer sets to the count of
the last message it copied out are the whole protocol, no lock. Where each array lies is the
writer's choice alone (it remembers the arrays not yet freed: ``RingWriter.held``).

A leaf larger than a quarter of the ring falls back to torch's shared-memory path (as a copy:
``transport.encode``). A tensor whose dtype NumPy lacks (bfloat16, float8, complex32) goes
through the ring as integers of its element size and is viewed back on receipt.

A writer uses only the first ``span`` bytes of its ring, from 1 MB, doubling whenever what it
holds leaves no room, up to the whole ring; inside the span it writes after the newest array
held or, when that does not fit, at the start if the oldest has left it (:func:`place`), and
with nothing held, at the start. The pages a ring touches are those its samples in flight
need: every ring was written all the way round, so 32 workers' rings held 512 MB of shared
memory for 64 KB samples (a sweep). Offsets used to be the byte count modulo the ring, so
going back to the start was a pad up to the ring's end, freed only with the array after it: a
consumer one 20 MB sample behind made the writer wait on that pad, the span doubled to the
whole ring, and 180-240 MB of each 256 MB ring became resident (docs/benchmarks.md, "Ring
memory").
"""

from __future__ import annotations

import collections
import mmap
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from headrace.runtime.parent import parent_gone
from headrace.runtime.transport import numpy_bits, plain_tensor, steps_back

RING_BYTES = 16 * 1024 * 1024
"""Bytes of one worker's ring where it is allocated up front (start methods other than fork)."""
FORK_RING_BYTES = 256 * 1024 * 1024
"""Bytes of one worker's ring under fork: address space only, since its pages are made on
first touch and a writer touches the span its samples in flight need (``RingWriter.span``).
Leaves up to a quarter of it (64 MB) go through the ring; with 16 MB rings every leaf over
4 MB went through torch's shared memory, one descriptor and a handshake each, and a sweep
measured 5-16 MB samples at about twice torch's epoch."""
SPAN_BYTES = 1024 * 1024
"""Bytes of its ring a writer starts with (``RingWriter.span``)."""
MIN_LEAF = 4096
"""Arrays smaller than this many bytes are pickled inline (cheaper than a ring slot)."""
ALIGN = 64


class Ring:
    """The shared part: the buffer and the consumer's read position (bytes, monotonic).

    With ``fork`` the buffer is an anonymous shared mapping the child inherits: the kernel
    zero-fills its pages on first touch, so creating a ring costs nothing up front (a
    ``RawArray`` is zeroed eagerly: 0.3 s for twelve 16 MB rings). Other start methods need a
    buffer that can be sent at process start, so they get a ``RawArray``.
    """

    def __init__(self, ctx: Any, size: int | None = None) -> None:
        fork = ctx.get_start_method() == "fork"
        size = size or (FORK_RING_BYTES if fork else RING_BYTES)
        if fork:
            try:
                self.buf: Any = mmap.mmap(-1, size)  # MAP_SHARED | MAP_ANONYMOUS
            except OSError:  # strict overcommit (vm.overcommit_memory=2) counts the mapping
                size = min(size, RING_BYTES)
                self.buf = mmap.mmap(-1, size)
        else:
            self.buf = ctx.RawArray("B", size)
        self.size = size
        self.read_pos = ctx.RawValue("Q", 0)
        self.beside = ctx.RawValue("Q", 0)
        """Bytes of the arrays (and bytes) of the writer's last encoded value that went beside
        the ring (:func:`encode`: over a quarter of it, strided, or with no room; by torch's
        shared memory or pickled), which a message's ``ring_end`` does not count."""

    def array(self) -> np.ndarray:
        return np.frombuffer(self.buf, dtype=np.uint8)

    def close(self) -> None:
        """Unmap the training process's side once its worker is gone (``WorkerPool``'s
        dispose): the pages it made resident (up to the span its samples needed, 256 MB of
        address space) went back only when the last reference to the worker's handle did,
        and an iterator kept after its epoch (a framework's fetcher, a traceback) kept them
        for as long. Left to the garbage collector while a view of it is still alive (the
        mapping refuses to close then); a ``RawArray`` (other start methods) is left to it
        too."""
        if isinstance(self.buf, mmap.mmap):
            try:
                self.buf.close()
            except BufferError:
                pass


class RingRef:
    """Where one array of a sample lies in the ring. ``kind``: "np" (a NumPy array), "torch"
    (a tensor), or a ``torch.dtype`` NumPy lacks (bfloat16, float8, complex32): a tensor of
    that dtype whose bits the ring holds as integers of the same size (``dtype``), viewed
    back on receipt (:func:`tensor_of`)."""

    __slots__ = ("dtype", "kind", "offset", "shape")

    def __init__(self, kind: str | torch.dtype, offset: int, dtype: str,
                 shape: tuple[int, ...]) -> None:
        self.kind = kind
        self.offset = offset
        self.dtype = dtype
        self.shape = shape

    def __reduce__(self):
        return (RingRef, (self.kind, self.offset, self.dtype, self.shape))


class RingWriter:
    """Worker side: reserves space and copies arrays in."""

    def __init__(self, ring: Ring, parent_pid: int) -> None:
        self.ring = ring
        self.mem = ring.array()
        self.write_pos = 0
        """Bytes written in all (monotonic): a message's ``ring_end``, which the consumer sets
        its read position to once it has copied the message's arrays out."""
        self.beside = 0
        """Bytes of the value being encoded that go beside the ring (``Ring.beside``)."""
        self.held: collections.deque[tuple[int, int, int]] = collections.deque()
        """``(end, offset, nbytes)`` of arrays written and not yet known freed, oldest first
        (``end``: ``write_pos`` after the array, freed once the read position reaches it)."""
        self.span = min(ring.size, SPAN_BYTES)
        """Bytes from the ring's start this writer uses (grows, up to the ring, when what is
        held leaves no room in it): pages beyond it are never touched."""
        self.parent_pid = parent_pid
        self.before_wait: Callable[[], Any] = lambda: None
        """Called once before waiting for space (the worker sends samples it kept, whose
        space the training process frees only once it has them)."""
        self.value_start: int | None = None
        """``write_pos`` (bytes) when the value being encoded began (:func:`encode`; None
        between values): its arrays are freed only with its own message, not yet sent."""

    def fits(self, nbytes: int) -> bool:
        return nbytes <= self.ring.size // 4

    def put(self, arr: np.ndarray) -> int | None:
        """Copy ``arr`` into the ring; returns its offset. Waits while the ring is full; None
        (nothing copied) where only the value being encoded could make room: the caller
        sends ``arr`` another way."""
        n = (arr.nbytes + ALIGN - 1) // ALIGN * ALIGN
        offset = self._reserve(n)
        if offset is None:
            return None
        self.write_pos += n
        self.held.append((self.write_pos, offset, n))
        np.ndarray(arr.shape, arr.dtype, self.ring.buf, offset)[...] = arr  # C order, as read
        return offset

    def _reserve(self, n: int) -> int | None:
        """An offset with ``n`` free bytes, growing the span if that avoids a wait; None when
        no wait can make room: the arrays of the value being encoded, which its message (not
        yet sent) frees, leave none anywhere in the ring. A sample whose arrays add up to
        more than the ring, or wrap round onto its own first one, waited for ever (5 arrays of
        4 MiB in a spawned worker's 16 MiB ring, 5 of 60 MiB in a forked worker's 256 MiB; a
        review): such an array goes by ``transport.encode`` instead."""
        read_pos, held = self.ring.read_pos, self.held
        asked = False
        while True:
            read = read_pos.value
            while held and held[0][0] <= read:
                held.popleft()
            offset = place(held, n, self.span)
            if offset is None:
                self.span = grown_span(held, n, self.span, self.ring.size)
                offset = place(held, n, self.span)
            if offset is not None:
                return offset
            start = self.value_start
            if start is not None and place([h for h in held if h[0] > start], n,
                                           self.ring.size) is None:
                return None
            if not asked:  # the consumer has not freed enough yet
                self.before_wait()
                asked = True
            elif parent_gone(self.parent_pid):
                raise SystemExit(0)
            else:
                time.sleep(0.0005)


def place(held: Sequence[tuple[int, int, int]], n: int, span: int) -> int | None:
    """Where ``n`` bytes go in a ring's first ``span`` bytes (None: no room until the consumer
    frees some), given the arrays still held, ``(end, offset, nbytes)`` oldest first.

    Nothing held: at the start, so a ring whose consumer keeps up touches only the pages one
    array needs. Otherwise right after the newest array, else at the start if that is clear of
    the oldest: one circular buffer inside the span. Offsets and the monotonic ``end`` are
    independent, so going back to the start leaves no pad that must be freed first (a pad to
    the ring's end, freed only with the array after it, made a consumer one 20 MB sample
    behind grow a 256 MB ring's span to the whole ring)."""
    if not held:
        return 0 if n <= span else None
    head = held[0][1]
    tail = held[-1][1] + held[-1][2]
    if tail > head:  # what is held lies in one piece, [head, tail)
        if tail + n <= span:
            return tail
        return 0 if n <= head else None
    return tail if tail + n <= head else None  # wrapped: the room is [tail, head)


def grown_span(held: Sequence[tuple[int, int, int]], n: int, span: int, size: int) -> int:
    """The smallest span, doubling ``span`` up to the ring's ``size``, in which :func:`place`
    finds room for ``n`` bytes; ``span`` itself where none does (held arrays wrapped round
    the start: only the consumer freeing the oldest makes room, so the writer waits)."""
    s = span
    while s < size:
        s = min(size, 2 * s)
        if place(held, n, s) is not None:
            return s
    return span


def map_leaves(x: Any, fn: Callable[[Any], Any]) -> Any:
    """``x`` with ``fn`` applied to every leaf of its exact ``dict``/``list``/``tuple`` and
    namedtuple containers (the containers torch's ``default_collate`` walks), rebuilt as they
    were; other containers (``torch.return_types.max``, a list subclass) are leaves."""
    if type(x) is dict:
        return {k: map_leaves(v, fn) for k, v in x.items()}
    if type(x) is tuple:
        return tuple(map_leaves(v, fn) for v in x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(map_leaves(v, fn) for v in x))
    if type(x) is list:
        return [map_leaves(v, fn) for v in x]
    return fn(x)


def encode(x: Any, w: RingWriter, other: Callable[[Any], Any] = lambda leaf: leaf) -> Any:
    """Replace large arrays/tensors of a sample by ring references (worker side); every other
    leaf becomes ``other(leaf)`` (the worker passes ``transport.encode``: one walk of the
    sample instead of two)."""
    w.value_start = w.write_pos
    w.beside = 0
    try:
        out = map_leaves(x, lambda leaf: _encode_leaf(leaf, w, other))
    finally:
        w.value_start = None
    w.ring.beside.value = w.beside
    return out


def decode(x: Any, ring: Ring, other: Callable[[Any], Any] = lambda leaf: leaf) -> Any:
    """Copy ring references out into fresh arrays/tensors (training-process side); every
    other leaf becomes ``other(leaf)`` (``transport.decode``, the inverse of :func:`encode`'s)."""
    return map_leaves(x, lambda leaf: _decode_leaf(leaf, ring, other))


def _encode_leaf(x: Any, w: RingWriter, other: Callable[[Any], Any]) -> Any:
    if type(x) in _SCALARS:  # most leaves of small samples: one check, not four
        return other(x)
    if isinstance(x, torch.Tensor):
        if x.layout is not torch.strided or x.is_meta:
            w.beside += _counted(tensor_bytes, x)
            return other(x)
        nbytes = x.numel() * x.element_size()
        if nbytes < MIN_LEAF:
            return other(x)
        bits = numpy_bits(x) if plain_tensor(x) and w.fits(nbytes) else None  # None: a
        # quantized tensor, a conjugate view, one over a quarter of the ring
        offset = None if bits is None else w.put(bits[0])  # None: no room the ring could
        # make (RingWriter._reserve)
        if bits is None or offset is None:
            w.beside += nbytes
            return other(x)
        a, view = bits
        return RingRef("torch" if view is None else view, offset, a.dtype.str, a.shape)
    if type(x) is np.ndarray:
        if x.nbytes < MIN_LEAF:
            return other(x)
        if (x.dtype != object and x.dtype.kind in "biufc" and not steps_back(x)  # its
                and w.fits(x.nbytes)):  # strides kept: default_collate refuses them
            offset = w.put(x)
            if offset is not None:
                return RingRef("np", offset, x.dtype.str, x.shape)
        w.beside += x.nbytes
    elif isinstance(x, (bytes, bytearray)):
        w.beside += len(x)  # pickled, or shared from transport.encode's INLINE_LIMIT on
    elif isinstance(x, (dict, list, tuple)):  # a subclass, which map_leaves leaves whole;
        # transport.encode sends the arrays it holds
        w.beside += _counted(lambda v: bytes_inside(v, 0, [MAX_VISITS]), x)
    return other(x)


def _counted(count: Callable[[Any], int], x: Any) -> int:
    """``count(x)``, or 0 where it raises: the bytes cap a queue's depth, an estimate, never a
    sample's failure (a review: a dict subclass whose ``values()`` raises failed samples that
    the transport and pickle send, reading its ``items()``); a leaf that cannot be read to be
    sent fails its sample there, as before."""
    try:
        return count(x)
    except Exception:  # noqa: BLE001 - whatever the leaf's own code raises
        return 0


_SCALARS = frozenset({int, float, bool, str, complex, type(None)})


def bytes_inside(x: Any, depth: int, left: list[int]) -> int:
    """Bytes of the tensors, arrays and bytes in ``x`` and the dicts (their ``items()``, as
    the transport reads them), lists and tuples it holds, any subclass, ``MAX_DEPTH`` deep:
    what ``transport.encode`` may send beside the ring. ``left[0]``: the items it may still
    look at, each item of every container charged, a look at a sequence's types (at C speed;
    a sequence of scalars ends there) one item per ``SCALARS_PER_ITEM`` (``MAX_VISITS`` a
    leaf; the items after it count nothing): the walk took 26 ms for a list subclass of
    100,000 ints, one call per item, and 414 ms for one holding a 10,000-int list 1,024
    times (reviews). Other objects
    count nothing (pickled, their size unknown without pickling them). An object held twice
    counts twice: the transport copies a dict subclass's values one by one (a list subclass
    pickled whole sends it once: counted high, the queue errs short)."""
    if isinstance(x, torch.Tensor):
        return tensor_bytes(x)
    if isinstance(x, np.ndarray):
        return x.nbytes
    if isinstance(x, (bytes, bytearray)):
        return len(x)
    if depth >= MAX_DEPTH:
        return 0
    if isinstance(x, dict):
        items: Any = (v for _, v in x.items())
    elif isinstance(x, (list, tuple)):
        # a look at its item types at C speed, charged as the items it is worth; token ids
        # and the like end there (reviews: charged item by item, 1,100 ids before an array
        # spent the budget; charged per list, 512 boxes of 4 did; uncharged where the look
        # failed, nested lists repeated it)
        if len(x) <= SCALARS_PER_ITEM * left[0]:
            left[0] -= len(x) // SCALARS_PER_ITEM
            if set(map(type, x)) <= _SCALARS:
                return 0
        items = x
    else:
        return 0
    total = 0
    for v in items:
        if left[0] <= 0:
            break
        left[0] -= 1
        if type(v) not in _SCALARS:
            total += bytes_inside(v, depth + 1, left)
    return total


def tensor_bytes(x: torch.Tensor) -> int:
    """Bytes a tensor holds: a strided one's elements; a sparse one's values and indices (its
    ``numel()`` is its dense size: 4 GB counted for 5 values, a review); a meta one's none."""
    if x.is_meta:
        return 0
    if x.layout is torch.strided:
        return x.numel() * x.element_size()
    parts: tuple[torch.Tensor, ...]
    if x.layout is torch.sparse_coo:
        parts = (x._values(), x._indices())
    elif x.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = (x.values(), x.crow_indices(), x.col_indices())
    elif x.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = (x.values(), x.ccol_indices(), x.row_indices())
    elif x.layout is torch.jagged:  # a nested tensor's values and their offsets
        parts = (x.values(), x.offsets())  # type: ignore[attr-defined]
    else:
        return 0
    return sum(p.numel() * p.element_size() for p in parts)


MAX_DEPTH = 8
"""Container levels :func:`bytes_inside` walks."""
MAX_VISITS = 1024
"""Items :func:`bytes_inside` looks at in one leaf (its cost bounded: about 1 ms at most)."""
SCALARS_PER_ITEM = 64
"""Items of a sequence whose types one look (at C speed) reads for one item charged."""


def _decode_leaf(x: Any, ring: Ring, other: Callable[[Any], Any]) -> Any:
    if not isinstance(x, RingRef):
        return other(x)
    out = np.ndarray(x.shape, x.dtype, ring.buf, x.offset).copy()
    return out if x.kind == "np" else tensor_of(torch.from_numpy(out), x.kind)


def tensor_of(t: torch.Tensor, kind: str | torch.dtype) -> torch.Tensor:
    """``t`` (the tensor of a ring array) as the tensor a ``RingRef`` of ``kind`` carried:
    itself, or for a dtype NumPy lacks, a view of its bits as that dtype."""
    return t.view(kind) if isinstance(kind, torch.dtype) else t
