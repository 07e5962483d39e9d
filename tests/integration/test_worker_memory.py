"""What one more forked worker adds to the machine's memory, as ``num_workers="auto"`` counts it
(``runtime/worker_scaling.worker_memory``): its own pages, not those it shares."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import psutil
import pytest

from headrace.runtime.worker_scaling import worker_memory

pytestmark = pytest.mark.integration


def test_a_forked_worker_counts_its_own_memory_not_the_pages_it_shares():
    # its RSS counted a 64 MB array it never wrote (shared with this process): a dataset
    # holding 1 GB so read as 1 GB a worker, and num_workers="auto" ran 1 worker in a 3 GB
    # cgroup where torch's 16 fitted (a bug hunt)
    held = np.ones(64 << 20, np.uint8)  # written here: this process's own pages...
    assert worker_memory(None) > 64 << 20  # ...until a fork shares them
    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()

    def child() -> None:
        assert held[-1] == 1  # read, never written
        ready.set()
        done.wait(30)

    p = ctx.Process(target=child)
    p.start()
    try:
        assert ready.wait(30)
        rss = psutil.Process(p.pid).memory_info().rss
        own = worker_memory(p.pid)
        assert rss > 64 << 20  # the shared array counts in its RSS...
        assert own is not None and own < 32 << 20  # ...not in what it adds
    finally:
        done.set()
        p.join(30)
