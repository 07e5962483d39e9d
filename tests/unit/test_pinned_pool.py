"""Pinned batch memory: a buffer is reused only when no batch references it and the copy that
reads it has completed (fake allocator and fences: no CUDA needed)."""

import gc

import numpy as np
import torch
from torch.utils.data import default_collate

from headrace.runtime.assembly import BatchAssembly
from headrace.runtime.bufferpool import BufferPool
from tests.device_fakes import FakeFence, FakePinned


def _batch(pool: BufferPool, value: float) -> dict:
    asm = BatchAssembly(4, default_collate, True, pool)
    for r in range(4):
        asm.put(r, r, {"x": np.full((16, 16), value + r, np.float32), "i": r}, None)
    return asm.finish([0, 1, 2, 3])


def test_batches_are_assembled_in_pool_memory():
    mem = FakePinned()
    pool = BufferPool(min_bytes=0, memory=mem)
    assert pool.pinned
    b = _batch(pool, 0.0)
    assert b["x"].untyped_storage().data_ptr() in mem.allocations  # filled in place, no copy
    assert torch.equal(b["x"][2], torch.full((16, 16), 2.0))


def test_a_live_batch_is_never_reused_whatever_its_fences():
    mem = FakePinned()
    pool = BufferPool(min_bytes=0, memory=mem)
    first = _batch(pool, 0.0)
    fence = FakeFence()
    fence.done = True
    assert pool.fence([first["x"], first["i"]], fence) == 1  # "i": ints, collated by torch
    second = _batch(pool, 100.0)  # first is alive: new memory
    assert pool.reused == 0
    assert first["x"].untyped_storage().data_ptr() != second["x"].untyped_storage().data_ptr()
    assert torch.equal(first["x"][0], torch.zeros(16, 16))


def test_a_released_buffer_waits_for_the_copy_that_reads_it():
    mem = FakePinned()
    pool = BufferPool(min_bytes=0, memory=mem)
    batch = _batch(pool, 0.0)
    copy_done = FakeFence()
    pool.fence([batch["x"], batch["i"]], copy_done)  # the prefetcher's event after its H2D copy
    addr = batch["x"].untyped_storage().data_ptr()
    del batch
    gc.collect()
    assert mem.fences == []  # the prefetcher's fence is used, none recorded at release
    busy = _batch(pool, 1.0)  # the copy is still running: not reused
    assert busy["x"].untyped_storage().data_ptr() != addr
    assert pool.reused == 0 and pool.skipped_busy >= 1
    copy_done.done = True
    after = _batch(pool, 2.0)
    assert after["x"].untyped_storage().data_ptr() == addr and pool.reused >= 1
    assert copy_done.waited == 0  # skipped, never waited for
    del busy, after


def test_release_without_a_known_copy_fences_on_the_memory_source():
    mem = FakePinned()
    pool = BufferPool(min_bytes=0, memory=mem)
    batch = _batch(pool, 0.0)
    addr = batch["x"].untyped_storage().data_ptr()
    del batch  # e.g. the training loop issued batch.to("cuda", non_blocking=True) itself
    gc.collect()
    assert len(mem.fences) == 1  # one per pooled array ("i" holds ints: not pooled)
    other = _batch(pool, 1.0)
    assert other["x"].untyped_storage().data_ptr() != addr
    for f in mem.fences:
        f.done = True
    del other
    gc.collect()
    again = _batch(pool, 2.0)
    assert pool.reused == 1 and torch.equal(again["x"][3], torch.full((16, 16), 5.0))


def test_busy_buffers_are_not_freed_early_and_stay_bounded():
    mem = FakePinned()
    pool = BufferPool(max_idle=2, min_bytes=0, memory=mem)
    arrays = [pool.empty((1000,), np.uint8) for _ in range(4)]
    arrays.clear()  # 4 released, all fences pending: none may be freed, although max_idle=2
    assert pool.idle_bytes == 4 * 1000
    assert all(f.waited == 0 for f in mem.fences)
    mem.fences[0].done = True
    mem.fences[1].done = True
    more = [pool.empty((10,), np.uint8)]  # a release triggers eviction of completed ones
    more.clear()
    assert pool.idle_bytes == 2 * 1000 + 10  # the two finished ones went, the busy ones stay
    arrays = [pool.empty((500,), np.uint8) for _ in range(6)]
    arrays.clear()  # beyond 2 × max_idle waiting: the oldest copy is waited for
    assert sum(f.waited for f in mem.fences) >= 1
    assert len(pool._idle) <= 2 * pool.max_idle


def test_pageable_memory_has_no_fences():
    pool = BufferPool(min_bytes=0)
    assert not pool.pinned
    a = pool.empty((100,), np.uint8)
    del a
    b = pool.empty((100,), np.uint8)
    assert pool.reused == 1 and pool.skipped_busy == 0
    del b
