"""Batch memory reused once the training loop has let go of a batch.

A batch's arrays are new tensors every time, as torch's ``default_collate`` makes them. For
large batches that memory comes straight from the kernel (glibc serves allocations above its
mmap threshold, at most 32 MiB, with fresh mappings), and the kernel zeroes every page on first
touch: on the imagenet workload (38.5 MB per batch of 64) zeroing took more of the training
process's CPU than copying the samples in (perf: 23% in ``clear_page_erms`` against 17% in
``memmove``), on cores the workers need. The buffers themselves come from
``pinning.PageableMemory`` (ordinary pages, not the huge pages NumPy asks for: see there).

:class:`BufferPool` hands out arrays over recycled buffers and takes a buffer back only when
nothing can reach it any more: every tensor and array made from a batch keeps the array that
the pool handed out alive (tensors through their storage, NumPy views through their ``base``,
which NumPy does not collapse past an array over a foreign buffer), and a ``weakref.finalize``
on that array returns the buffer. A batch the user keeps is never overwritten; the pool just
allocates anew. At most ``max_idle`` buffers wait for reuse, whatever their sizes (the oldest
is freed first), so the pool holds at most that many batch arrays beyond what the user holds,
even when every batch has a shape of its own; one that ``STALE_AFTER`` requests did not take is
freed, and an epoch's end frees them all (``trim``).

With pinned memory (``runtime/pinning.py``) a buffer may still be read by an asynchronous copy
to the device after its batch died: each released buffer then carries a fence (the event the
device prefetcher recorded after its copy, :meth:`BufferPool.fence`, else one from the memory
source), and the pool neither reuses nor frees it before that fence has completed. A buffer
whose copy is still running is skipped (a new one is allocated) rather than waited for; only
when more than ``2 × max_idle`` buffers wait does releasing one wait for the oldest copy.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import numpy as np

from headrace.runtime.pinning import Fence, HostMemory, PageableMemory

MIN_BYTES = 1 << 20
"""Arrays smaller than this (bytes) are plain ``np.empty``: malloc reuses their memory already."""

MAX_IDLE = 4
"""Buffers kept for reuse, all sizes together (two batches of two large arrays each); beyond
that the oldest is freed."""
STALE_AFTER = 16
"""An idle buffer no request of its size took in this many requests of other sizes is freed:
batches whose shapes do not repeat (variable-size volumes) left ``MAX_IDLE`` buffers of sizes
never asked for again, up to 1.6 GB with 100 MB samples in batches of 4 (a sweep)."""


class BufferPool:
    """Arrays over reused buffers, returned to the pool when the last reference dies.

    Thread-safe: the scheduler thread takes buffers, and a finalizer gives them back in
    whichever thread drops a batch's last reference (usually the training loop).
    """

    def __init__(
        self, max_idle: int = MAX_IDLE, min_bytes: int = MIN_BYTES, memory: HostMemory | None = None,
    ) -> None:
        if max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {max_idle}")
        self.max_idle = max_idle
        self.min_bytes = min_bytes
        self.memory: HostMemory = memory if memory is not None else PageableMemory()
        self._idle: list[tuple[np.ndarray, Fence | None, int]] = []  # free raw buffers, oldest
        # first, with the request count when each was freed
        self._requests = 0  # arrays of at least min_bytes asked for
        self._live: set[int] = set()  # addresses of buffers handed out
        self._fences: dict[int, Fence] = {}  # address -> fence set while its batch is alive
        self._lock = threading.Lock()
        self.reused = 0  # arrays served from a recycled buffer
        self.allocated = 0  # arrays that needed a new buffer (at least min_bytes)
        self.skipped_busy = 0  # times a free buffer of the right size was still being copied

    @property
    def pinned(self) -> bool:
        """Whether pooled arrays are page-locked (see ``runtime/pinning.py``)."""
        return self.memory.pinned

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype=dt)
        raw = None
        with self._lock:
            self._requests += 1
            for i in range(len(self._idle) - 1, -1, -1):  # the most recently freed first
                buf, fence, _ = self._idle[i]
                if buf.nbytes != nbytes:
                    continue
                if fence is not None and not fence.query():
                    self.skipped_busy += 1  # a copy still reads it: never reused early
                    continue
                raw = buf
                del self._idle[i]
                break
            if self._idle:
                self._drop(self._requests - STALE_AFTER)
        if raw is None:
            raw = self.memory.allocate(nbytes)
            self.allocated += 1
        else:
            self.memory.set_idle(raw, False)  # a process the user forks may read the batch
            self.reused += 1
        with self._lock:
            self._live.add(raw.ctypes.data)
        # An array over a memoryview: views of it keep *it* alive (NumPy stops collapsing
        # ``base`` at an array whose base is not an array), so its finalizer runs only when
        # no tensor or view of the batch is left.
        handle = np.frombuffer(raw.data, dtype=dt, count=math.prod(shape))
        weakref.finalize(handle, self._release, raw).atexit = False
        return handle.reshape(shape)

    def fence(self, tensors: Any, fence: Fence) -> int:
        """Guard the pooled buffers under ``tensors`` with ``fence`` (the event recorded after
        the copy that reads them): once released, they are not reused before it completes.

        Tensors not over a pooled buffer are ignored. Returns how many buffers were fenced.
        """
        n = 0
        with self._lock:
            for t in tensors:
                addr = t.untyped_storage().data_ptr()
                if addr in self._live:
                    self._fences[addr] = fence
                    n += 1
        return n

    @property
    def idle_bytes(self) -> int:
        """Bytes held in buffers waiting for reuse."""
        with self._lock:
            return sum(raw.nbytes for raw, _, _ in self._idle)

    def trim(self) -> None:
        """Free every idle buffer no copy still reads (an epoch ended): between epochs they
        held up to ``max_idle`` batches of memory that torch's loader gives back (a sweep:
        1.8 GB with 100 MB samples), to save the next epoch's first few batches their page
        faults."""
        with self._lock:
            self._drop(self._requests + 1)

    def _drop(self, before: int) -> None:
        """Free the idle buffers freed before request ``before`` whose fence has completed
        (lock held)."""
        self._idle = [e for e in self._idle
                      if not (e[2] < before and (e[1] is None or e[1].query()))]

    def _release(self, raw: np.ndarray) -> None:
        addr = raw.ctypes.data
        with self._lock:
            fence = self._fences.pop(addr, None)
            self._live.discard(addr)
        if fence is None:
            try:
                fence = self.memory.release_fence()
            except Exception:  # noqa: BLE001 - e.g. CUDA torn down at exit: never reuse it
                return
        try:  # before any other thread can take it: workers forked from now on do not share it
            self.memory.set_idle(raw, True)
        except Exception:  # noqa: BLE001 - at exit, say: freed rather than reused
            return
        with self._lock:
            self._idle.append((raw, fence, self._requests))
            wait = self._evict()
        if wait is not None:  # far more buffers idle than allowed, all still being copied
            wait.synchronize()
            with self._lock:
                self._evict()

    def _evict(self) -> Fence | None:
        """Free the oldest idle buffers beyond ``max_idle`` whose fence completed (lock held).

        Returns the fence to wait for when even ``2 × max_idle`` buffers are exceeded."""
        i = 0
        while len(self._idle) > self.max_idle and i < len(self._idle):
            fence = self._idle[i][1]
            if fence is None or fence.query():
                del self._idle[i]
            else:
                i += 1
        if len(self._idle) > 2 * self.max_idle:
            return self._idle[0][1]
        return None
