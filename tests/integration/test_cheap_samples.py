"""Cheap samples (microseconds of work each): worker processes get several at once and send
what they finish in shared messages (planner/queueing.py), and still nothing is lost or
duplicated, in order or not, when a worker is killed while it holds finished samples."""

import os
import random
import signal
from collections import Counter

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.planner.queueing import QUEUE_BYTES
from headrace.runtime import ring
from tests.helpers import IndexDataset
from tests.integration.test_faults import worker_pids

pytestmark = pytest.mark.integration

N = 3000  # the first 64 measure the typical sample (MIN_DEPTH until then), the rest share messages


@pytest.mark.parametrize("in_order", [False, True])
def test_cheap_samples_share_messages_and_arrive_exactly_once_in_order(in_order, no_leaks):
    order = random.Random(3).sample(range(N), N)
    loader = hr.DataLoader(IndexDataset(N), batch_size=32, num_workers=2, sampler=order,
                           in_order=in_order)
    it = iter(loader)
    got = [i for b in it for i in b.tolist()]
    assert Counter(got) == Counter(range(N))
    if in_order:
        assert got == order
    c = it.scheduler.counters
    assert loader.monitor.queue_depth() > 2  # the measured typical sample is cheap
    assert c.task_messages > 0 and c.shared_samples > 0
    assert c.fast == N
    st = loader.stats().last
    assert st.shared_samples == c.shared_samples and 0 < st.shared_samples <= N
    line = next(ln for ln in loader.explain().splitlines() if ln.startswith("messages:"))
    assert "at once in one message" in line and f"of {N} samples came in shared" in line


@pytest.mark.parametrize("in_order", [False, True])
def test_a_worker_killed_while_it_holds_finished_samples_loses_none(in_order, no_leaks):
    loader = hr.DataLoader(IndexDataset(N), batch_size=32, num_workers=2, shuffle=True,
                           in_order=in_order)
    got, it = [], iter(loader)
    for k, b in enumerate(it):
        got += b.tolist()
        if k == 20:  # past the warm-up: queues are deep, results kept and shared
            assert loader.monitor.queue_depth() > 2
            os.kill(worker_pids(it)[0], signal.SIGKILL)
    assert Counter(got) == Counter(range(N))
    assert loader.stats().worker_restarts >= 1


class _Arrays(torch.utils.data.Dataset):
    """1 MiB arrays of ``i``, made in microseconds."""

    def __len__(self):
        return 600

    def __getitem__(self, i):
        return np.full(1 << 18, i, dtype=np.float32)


def test_unprofiled_samples_that_miss_the_ring_are_queued_by_their_bytes(monkeypatch, no_leaks):
    """Samples over a quarter of a worker's ring go by torch's shared memory; unprofiled, no
    size was measured and a message's ring end counts none of theirs, so they were queued by
    time alone: a spawned loader of 6 MB samples of microseconds, 128 at once (a review)."""
    monkeypatch.setattr(ring, "FORK_RING_BYTES", 1 << 20)  # arrays over 256 KiB miss it
    loader = hr.DataLoader(_Arrays(), batch_size=8, num_workers=2,
                           options=hr.Options(profile=False))
    got = [int(s[0]) for b in loader for s in b]
    assert Counter(got) == Counter(range(600))
    assert loader.monitor.queue_depth() <= QUEUE_BYTES // (1 << 20)
    line = next(ln for ln in loader.explain().splitlines() if ln.startswith("messages:"))
    assert "of samples of 1.0 MB are queued on a worker at once" in line, line
