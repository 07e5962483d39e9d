"""Batch memory is reused only when nothing can reach the batch any more."""

import gc
import threading

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from headrace.runtime.assembly import BatchAssembly
from headrace.runtime.bufferpool import STALE_AFTER, BufferPool
from tests.device_fakes import FakePinned


def test_buffer_returns_only_after_every_tensor_and_view_is_gone():
    pool = BufferPool(min_bytes=0)
    a = pool.empty((8, 4), np.float32)
    a[:] = 1.0
    t = torch.from_numpy(a)
    row = t[3]  # a tensor view: keeps the storage, hence the array, alive
    arr = row.numpy()[1:]  # a NumPy view of a tensor view
    del a, t, row
    gc.collect()
    assert pool.idle_bytes == 0
    b = pool.empty((8, 4), np.float32)  # must not be the memory `arr` still sees
    b[:] = 2.0
    assert np.all(arr == 1.0)
    assert pool.allocated == 2 and pool.reused == 0
    del arr
    assert pool.idle_bytes == 8 * 4 * 4
    c = pool.empty((4, 8), np.float32)  # same size in bytes: reused
    assert pool.reused == 1 and pool.idle_bytes == 0
    assert c.shape == (4, 8) and c.dtype == np.float32 and c.flags.c_contiguous
    assert c.flags.writeable
    del b, c


def test_numpy_views_of_the_array_keep_it_alive():
    pool = BufferPool(min_bytes=0)
    a = pool.empty((6, 5), np.int64)
    a[:] = 7
    view = a[2:4, 1:]
    del a
    gc.collect()
    assert pool.idle_bytes == 0  # `view` still reads the buffer
    other = pool.empty((6, 5), np.int64)
    other[:] = 0
    assert np.all(view == 7)
    del view, other


def test_idle_buffers_are_bounded():
    pool = BufferPool(max_idle=2, min_bytes=0)
    arrays = [pool.empty((1000,), np.uint8) for _ in range(5)]
    del arrays
    assert pool.idle_bytes == 2 * 1000
    sized = [pool.empty((n,), np.uint8) for n in range(100, 110)]  # a size per batch
    while sized:
        sized.pop(0)  # freed in order of size
    assert pool.idle_bytes == 108 + 109  # the two most recently freed, whatever the sizes
    with pytest.raises(ValueError, match="max_idle"):
        BufferPool(max_idle=-1)


def test_small_arrays_are_plain_allocations():
    pool = BufferPool(min_bytes=1 << 20)
    a = pool.empty((10, 10), np.float32)
    del a
    assert pool.allocated == 0 and pool.idle_bytes == 0


def test_release_from_another_thread():
    pool = BufferPool(min_bytes=0)
    box = [pool.empty((64,), np.float64)]
    th = threading.Thread(target=box.clear)  # the last reference dies in that thread
    th.start()
    th.join()
    assert pool.idle_bytes == 64 * 8


def test_assembled_batches_from_a_pool_equal_default_collate_and_stay_intact():
    """A consumer that keeps every batch must never see one overwritten by a later one."""
    pool = BufferPool(min_bytes=0)
    kept = []
    for b in range(4):
        samples = [{"x": np.full((3, 5), 10 * b + r, np.float32), "i": 10 * b + r} for r in range(4)]
        asm = BatchAssembly(4, default_collate, True, pool)
        for r, s in enumerate(samples):
            asm.put(r, s["i"], s, None)
        got = asm.finish([0, 1, 2, 3])
        want = default_collate(samples)
        assert torch.equal(got["x"], want["x"]) and torch.equal(got["i"], want["i"])
        kept.append((got, want))
        del asm
    for got, want in kept:  # all kept: no buffer was handed out twice
        assert torch.equal(got["x"], want["x"])
    assert pool.reused == 0
    kept.clear()
    gc.collect()
    asm = BatchAssembly(4, default_collate, True, pool)
    asm.put(0, 0, {"x": np.zeros((3, 5), np.float32), "i": 0}, None)
    assert pool.reused == 1  # the batches let go of are reused


def _mapping_flags(addr: int) -> tuple[str, ...] | None:
    """The ``VmFlags`` of the mapping of this process holding ``addr`` (``/proc/self/smaps``),
    or None when no mapping holds it."""
    inside = False
    for line in open("/proc/self/smaps").read().splitlines():  # noqa: SIM115 - read at once
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return tuple(line.split()[1:])
    return None


def test_batch_buffers_do_not_ask_for_huge_pages():
    # NumPy madvises huge pages on allocations of 4 MB or more ("hg"); the pool's own
    # mappings leave that to the system's setting (bufferpool/pinning docstrings say why)
    nbytes = 16 << 20
    pool = BufferPool()
    a = pool.empty((nbytes // 4,), np.float32)
    a[:] = 1.0
    flags = _mapping_flags(a.ctypes.data + nbytes // 2)
    assert flags is not None and "hg" not in flags
    assert "wr" in flags and a.flags.writeable and a.flags.c_contiguous
    numpy_own = np.empty(nbytes, np.uint8)  # the check itself sees NumPy's advice
    assert "hg" in _mapping_flags(numpy_own.ctypes.data + nbytes // 2)


def test_idle_batch_buffers_are_not_inherited_by_forked_processes_held_ones_are():
    # "dc": the kernel's VM_DONTCOPY (MADV_DONTFORK). An idle buffer shared with workers forked
    # for a new epoch had every page copied when the training process wrote its next batch
    # there (112k page faults before each epoch's first batch in a sweep, about twice torch's
    # time to it); a batch the user holds must reach the processes the user forks (a bug hunt:
    # a child read another mapping's bytes where a held batch had been)
    pool = BufferPool()
    a = pool.empty((1 << 20,), np.float32)
    addr = a.ctypes.data
    assert "dc" not in _mapping_flags(addr)  # out: a batch
    del a
    gc.collect()
    assert pool.idle_bytes == 4 << 20 and "dc" in _mapping_flags(addr)  # waits in the pool
    b = pool.empty((1 << 20,), np.float32)
    assert b.ctypes.data == addr and pool.reused == 1
    assert "dc" not in _mapping_flags(addr)  # out again
    assert "dc" not in _mapping_flags(np.empty(4 << 20, np.uint8).ctypes.data)  # the check sees


def test_a_freed_batch_buffer_is_unmapped():
    pool = BufferPool(max_idle=0)  # nothing kept for reuse: freed when the batch dies
    a = pool.empty((4 << 20,), np.uint8)
    addr = a.ctypes.data
    assert _mapping_flags(addr) is not None
    del a
    gc.collect()
    assert pool.idle_bytes == 0 and _mapping_flags(addr) is None


def test_buffers_of_sizes_not_asked_for_again_are_freed():
    # variable-size volumes: every batch a shape of its own, none ever reused
    pool = BufferPool(max_idle=4)
    for k in range(4):
        pool.empty(((1 << 20) + k * 4096,), np.uint8)  # released at once (no reference kept)
    gc.collect()
    assert pool.idle_bytes >= 4 << 20
    for _ in range(STALE_AFTER + 1):
        a = pool.empty((2 << 20,), np.uint8)  # another size: the four above stay unused
        del a
    gc.collect()
    assert pool.idle_bytes == 2 << 20  # only the size still asked for


def test_trim_frees_what_waits_and_keeps_what_a_copy_still_reads():
    mem = FakePinned()  # every release gets a fence the test completes
    pool = BufferPool(memory=mem)
    a, b = pool.empty((1 << 20,), np.uint8), pool.empty((1 << 20,), np.uint8)
    del a, b
    gc.collect()
    mem.fences[0].done = True
    pool.trim()
    assert pool.idle_bytes == 1 << 20  # the one whose copy is still running
    mem.fences[1].done = True
    pool.trim()
    assert pool.idle_bytes == 0
