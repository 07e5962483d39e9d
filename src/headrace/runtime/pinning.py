"""Where batch memory comes from: pageable, or page-locked (pinned) for an accelerator.

torch's DataLoader pins a finished batch: a pin-memory thread copies every tensor into memory
from torch's caching host allocator, holding the GIL while it walks the batch (torch users
report ~50 ms GPU bubbles from it, pytorch/pytorch#77139). headrace assembles batches in place
(``runtime/assembly.py``) in buffers from ``runtime/bufferpool.py``; with ``pin_memory=True``
on a CUDA machine those buffers are pinned once, when the pool allocates them, so a batch is
born pinned and pinning it costs no copy at all.

The buffers are ordinary NumPy allocations registered with the driver (``cudaHostRegister``)
rather than torch's pinned allocations: torch's caching host allocator rounds every request up
to a power of two (a 38.5 MB imagenet batch would take 64 MB of locked memory) and its own
"do not reuse before the copy is done" bookkeeping only covers memory it handed out.

A pinned buffer may still be read by an asynchronous host-to-device copy after the training
loop dropped the batch, so the pool reuses (or frees) it only once a :class:`Fence` recorded
after that copy has completed. The device prefetcher (``runtime/prefetch.py``) gives the pool
the event it recorded right after its copy; for a copy the training loop issued itself the pool
records one on the current stream of the releasing thread when the batch is let go of (the
stream ``batch.to(device, non_blocking=True)`` used, unless the loop switched streams).

Allocation and fences are behind :class:`HostMemory`, so CPU tests drive the pool with fakes.
"""

from __future__ import annotations

import mmap
import weakref
from typing import Protocol

import numpy as np
import torch


class Fence(Protocol):
    """Marks the device work queued before it (``torch.cuda.Event`` is one)."""

    def query(self) -> bool:
        """True once every operation queued before the fence has completed (never blocks)."""
        ...

    def synchronize(self) -> None:
        """Block until the fence has completed."""
        ...


class HostMemory(Protocol):
    """Raw host memory for the buffer pool, and what guards its reuse."""

    pinned: bool
    """Whether :meth:`allocate` returns page-locked memory."""

    def allocate(self, nbytes: int) -> np.ndarray:
        """A new, writable, 1-D ``uint8`` array of ``nbytes`` bytes."""
        ...

    def release_fence(self) -> Fence | None:
        """A fence after the device work that may still read a buffer being let go of now
        (``None``: nothing reads host memory asynchronously)."""
        ...

    def set_idle(self, raw: np.ndarray, idle: bool) -> None:
        """``raw`` (from :meth:`allocate`) waits in the pool (``idle``) or holds a batch."""
        ...


class PageableMemory:
    """Ordinary memory; nothing reads it after its batch is gone.

    A private anonymous mapping of its own rather than ``np.empty``: NumPy asks the kernel for
    transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every allocation of 4 MB or more.
    On the 2-core bench VM the first epoch of a fresh imagenet loader spent 0.44-0.53 s of the
    training process's system time faulting its three 38.5 MB buffers in as huge pages, against
    0.10-0.15 s with ordinary pages, and 9% more wall time (``python -m
    headrace.bench.batch_memory``; no compaction stalls, so most likely 2 MB blocks the host had
    not backed yet). A batch buffer is written and read once per batch, front to back, where
    huge pages save little. The mapping follows the system's own THP setting (huge pages only
    where it says ``always``).

    Not inherited by forked processes while it waits in the pool (``MADV_DONTFORK``, set by
    :meth:`set_idle`): without persistent workers, each epoch forks new workers while the pool
    keeps the last epoch's buffers, and every page the workers then shared was copied when the
    training process wrote its next batch there: a page fault per page before each later
    epoch's first batch (a compatibility sweep saw that first batch take about twice torch's
    time with 50 MB samples). While a batch is out the buffer is inherited as any memory is:
    the user's code may fork (its own processes, a dataset built from kept batches and read by
    the next loader's workers) and read it there. A buffer marked for good at allocation left
    such a child a hole in its address space, where a later mapping could land: it read
    another mapping's bytes, silently, or crashed (a bug hunt).
    """

    pinned = False

    def allocate(self, nbytes: int) -> np.ndarray:
        if nbytes <= 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
            return np.empty(nbytes, dtype=np.uint8)
        pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return np.frombuffer(pages, dtype=np.uint8)  # keeps the mapping alive; unmapped with it

    def release_fence(self) -> Fence | None:
        return None

    def set_idle(self, raw: np.ndarray, idle: bool) -> None:
        """Forked processes inherit ``raw`` unless it is idle (one ``madvise``, a few µs)."""
        pages = getattr(raw.base, "obj", None)  # the memoryview NumPy holds, over the mapping
        if isinstance(pages, mmap.mmap) and hasattr(mmap, "MADV_DONTFORK"):
            pages.madvise(mmap.MADV_DONTFORK if idle else mmap.MADV_DOFORK)


_HOST_REGISTER_PORTABLE = 1
"""``cudaHostRegisterPortable``: the range is pinned for every CUDA context, not one device's."""


class CudaPinnedMemory:
    """NumPy memory page-locked with ``cudaHostRegister``, unregistered when it is freed.

    ``device``: the CUDA device whose current stream fences a buffer let go of by the training
    loop (pinned memory itself serves every device).
    """

    pinned = True

    def __init__(self, device: torch.device) -> None:
        if device.type != "cuda":
            raise ValueError(f"CudaPinnedMemory needs a CUDA device, got {device}")
        self.device = device

    def allocate(self, nbytes: int) -> np.ndarray:
        raw = np.empty(max(nbytes, 1), dtype=np.uint8)
        cudart = torch.cuda.cudart()
        ptr = raw.ctypes.data
        err = cudart.cudaHostRegister(ptr, raw.nbytes, _HOST_REGISTER_PORTABLE)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {raw.nbytes} bytes failed (CUDA error "
                               f"{int(err)}): host memory could not be pinned; run with "
                               "pin_memory=False (and no Options(device=)) to use pageable memory")
        # Weak-reference callbacks run before NumPy frees the data, so the range is
        # unregistered while it is still mapped. The pool drops a buffer only once its fence
        # has completed, so no copy reads it any more.
        weakref.finalize(raw, cudart.cudaHostUnregister, ptr).atexit = False
        return raw

    def release_fence(self) -> Fence | None:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def set_idle(self, raw: np.ndarray, idle: bool) -> None:
        """Inherited by forked processes always, as any NumPy memory."""


def host_memory_for(device: torch.device) -> HostMemory | None:
    """Pinned memory the pool can allocate for ``device``; ``None``: this accelerator has no
    such allocator here, and torch's helper pins finished batches instead."""
    return CudaPinnedMemory(device) if device.type == "cuda" else None
