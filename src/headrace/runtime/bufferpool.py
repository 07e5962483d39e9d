"""Batch memory reused once the training loop has let go of a batch.

A batch's arrays are new tensors every time, as torch's ``default_collate`` makes them. For
large batches that memory comes straight from the kernel (glibc serves allocations above its
mmap threshold, at most 32 MiB, with fresh mappings), and the kernel zeroes every page on first
touch: on the imagenet workload (38.5 MB per batch of 64) zeroing took more of the training
process's CPU than copying the samples in (perf: 23% in ``clear_page_erms`` against 17% in
``memmove``), on cores the workers need.

:class:`BufferPool` hands out arrays over recycled buffers and takes a buffer back only when
nothing can reach it any more: every tensor and array made from a batch keeps the array that
the pool handed out alive (tensors through their storage, NumPy views through their ``base``,
which NumPy does not collapse past an array over a foreign buffer), and a ``weakref.finalize``
on that array returns the buffer. A batch the user keeps is never overwritten; the pool just
allocates anew. At most ``max_idle`` buffers wait for reuse, whatever their sizes (the oldest
is freed first), so the pool holds at most that many batch arrays beyond what the user holds,
even when every batch has a shape of its own.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import numpy as np

MIN_BYTES = 1 << 20
"""Arrays smaller than this (bytes) are plain ``np.empty``: malloc reuses their memory already."""

MAX_IDLE = 4
"""Buffers kept for reuse, all sizes together (two batches of two large arrays each); beyond
that the oldest is freed."""


class BufferPool:
    """Arrays over reused buffers, returned to the pool when the last reference dies.

    Thread-safe: the scheduler thread takes buffers, and a finalizer gives them back in
    whichever thread drops a batch's last reference (usually the training loop).
    """

    def __init__(self, max_idle: int = MAX_IDLE, min_bytes: int = MIN_BYTES) -> None:
        if max_idle < 0:
            raise ValueError(f"max_idle must be >= 0, got {max_idle}")
        self.max_idle = max_idle
        self.min_bytes = min_bytes
        self._idle: list[np.ndarray] = []  # free raw buffers, oldest first
        self._lock = threading.Lock()
        self.reused = 0  # arrays served from a recycled buffer
        self.allocated = 0  # arrays that needed a new buffer (at least min_bytes)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < self.min_bytes:
            return np.empty(shape, dtype=dt)
        raw = None
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):  # the most recently freed first
                if self._idle[i].nbytes == nbytes:
                    raw = self._idle.pop(i)
                    break
        if raw is None:
            raw = np.empty(nbytes, dtype=np.uint8)
            self.allocated += 1
        else:
            self.reused += 1
        # An array over a memoryview: views of it keep *it* alive (NumPy stops collapsing
        # ``base`` at an array whose base is not an array), so its finalizer runs only when
        # no tensor or view of the batch is left.
        handle = np.frombuffer(raw.data, dtype=dt, count=math.prod(shape))
        weakref.finalize(handle, self._release, raw).atexit = False
        return handle.reshape(shape)

    @property
    def idle_bytes(self) -> int:
        """Bytes held in buffers waiting for reuse."""
        with self._lock:
            return sum(raw.nbytes for raw in self._idle)

    def _release(self, raw: np.ndarray) -> None:
        with self._lock:
            self._idle.append(raw)
            if len(self._idle) > self.max_idle:
                del self._idle[0]
