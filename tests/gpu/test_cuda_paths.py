"""The CUDA side of the last mile: pinned pool memory, the side stream, events.

Skipped without CUDA (CI has none); the same bookkeeping runs on the CPU with fakes in
tests/unit/test_pinned_pool.py, tests/unit/test_prefetch.py and
tests/integration/test_device_prefetch.py.
"""

from collections import Counter

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.runtime.bufferpool import BufferPool
from headrace.runtime.pinning import CudaPinnedMemory
from tests.helpers import ArraySource, noise

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none here"),
]

N = 48


def big(x: np.ndarray) -> dict:
    """256 KiB per sample: a batch of 8 is 2 MiB, over the pool's 1 MiB threshold."""
    i = int(x[0])
    return {"x": np.full((256, 256), float(i), np.float32), "i": i}


def make(**kw):
    pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True), hr.step(big)])
    return hr.DataLoader(pipe, **kw)


def test_pinned_memory_is_page_locked_and_reused_after_its_fence():
    pool = BufferPool(min_bytes=0, memory=CudaPinnedMemory(torch.device("cuda")))
    a = torch.from_numpy(pool.empty((1024, 1024), np.float32))
    assert a.is_pinned()
    addr = a.untyped_storage().data_ptr()
    a.fill_(1.0)
    dev = a.to("cuda", non_blocking=True)
    del a  # released while the copy may still run: fenced on the current stream
    b = torch.from_numpy(pool.empty((1024, 1024), np.float32))
    b.fill_(2.0)  # if b reuses a's buffer, only after a's copy completed
    assert torch.all(dev == 1.0).item()
    del b
    torch.cuda.synchronize()
    c = torch.from_numpy(pool.empty((1024, 1024), np.float32))
    assert pool.reused >= 1  # every fence has completed: a released buffer comes back
    assert c.is_pinned() and c.untyped_storage().data_ptr() in pool._live
    assert pool.allocated <= 2 and addr in {x.ctypes.data for x, _ in pool._idle} | pool._live


def test_pin_memory_assembles_batches_in_pinned_pool_memory():
    loader = make(num_workers=2, batch_size=8, pin_memory=True)
    batches = []
    for b in loader:
        pool = loader._buffers
        assert pool.pinned and b["x"].untyped_storage().data_ptr() in pool._live  # no copy
        assert b["x"].is_pinned() and b["i"].is_pinned()  # "i" (small) pinned by torch's helper
        batches.append(b)
    assert Counter(int(i) for b in batches for i in b["i"]) == Counter(range(N))


def test_a_pin_memory_device_this_machine_lacks_is_named_and_buffers_still_come_back():
    """``"cuda:N"`` past the device count was taken as it was: every released buffer's fence
    asked for a stream on a missing device, failed, and the pool reused no buffer."""
    missing = f"cuda:{torch.cuda.device_count()}"
    loader = make(num_workers=2, batch_size=8, pin_memory=True, pin_memory_device=missing)
    with pytest.warns(UserWarning, match=f"pin_memory_device='{missing}': this machine has"):
        for _ in range(2):
            for b in loader:
                b["x"].to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert loader._buffers.pinned and loader._buffers.reused > 0


def test_device_cpu_leaves_batches_in_pageable_host_memory():
    loader = make(num_workers=2, batch_size=8, options=hr.Options(device="cpu"))
    got = list(loader)
    assert all(b["x"].device.type == "cpu" and not b["x"].is_pinned() for b in got)
    assert not loader._buffers.pinned


def test_device_prefetch_gives_device_batches_equal_to_host_ones():
    host = [b["x"] for b in make(num_workers=2, batch_size=8, in_order=True,
                                options=hr.Options(seed=1))]
    loader = make(num_workers=2, batch_size=8, in_order=True,
                  options=hr.Options(seed=1, device="cuda"))
    got = []
    for b in loader:
        assert b["x"].device.type == "cuda"
        got.append((b["x"] * 1).cpu())  # used on the current stream right away
    assert all(torch.equal(h, g) for h, g in zip(host, got, strict=True))


def test_device_prefetch_state_dict_is_exact():
    opts = hr.Options(seed=2, device=torch.accelerator.current_accelerator())
    loader = make(num_workers=2, batch_size=6, shuffle=True, options=opts)
    it = iter(loader)
    first = [int(i) for _ in range(3) for i in next(it)["i"].cpu()]
    state = loader.state_dict()
    loader.close()
    resumed = make(num_workers=2, batch_size=6, shuffle=True, options=opts)
    resumed.load_state_dict(state)
    rest = [int(i) for b in resumed for i in b["i"].cpu()]
    assert Counter(first + rest) == Counter(range(N))
