"""A worker whose ``worker_init_fn`` does not return does not hold the epoch: the samples it
got before it was ready move to a worker that is ready and idle, each delivered once, and each
run once (the worker skips both when it starts at last)."""

from __future__ import annotations

import collections
import fcntl
import multiprocessing
import os
import select

import pytest
import torch
from torch.utils.data import Dataset

import headrace as hr
from headrace.runtime import starts
from tests.helpers import wait_at_gate

pytestmark = pytest.mark.integration
N = 48


class LoggedIndex(Dataset):
    """``__getitem__(i)`` is ``i``; every call appends ``"<pid> <i>"`` to ``log``. Once
    ``meet_now`` is set, each worker's next sample first waits at ``meet`` for the other's: both
    workers run samples from then on."""

    def __init__(self, log: str) -> None:
        ctx = multiprocessing.get_context("fork")  # shared with the workers by the fork
        self.log, self.meet, self.meet_now = log, ctx.Barrier(2), ctx.Event()
        self.met = False  # in this worker process

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {i}\n")
        if self.meet_now.is_set() and not self.met:
            self.meet.wait(30)
            self.met = True
        return i


class _Init:
    """``worker_init_fn``: worker 1 waits at the gate (leaving its pid in ``held``), then says
    it passed through the FIFO ``passed``."""

    def __init__(self, gate: str, held: str, passed: str) -> None:
        self.gate, self.held, self.passed = gate, held, passed

    def __call__(self, worker_id: int) -> None:
        if worker_id == 1:
            wait_at_gate(self.gate, self.held)
            fd = os.open(self.passed, os.O_WRONLY)  # the test has its read end open
            os.write(fd, b"x")
            os.close(fd)


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_ends_while_a_worker_is_still_in_its_worker_init_fn(tmp_path, no_leaks,
                                                                    shuffle, monkeypatch):
    # The first batch waits up to START_HOLD_S (30 s) for worker 1 to start, and the epoch's
    # end up to START_WAIT_S (5 s) to hear how it started; this test holds it in its
    # worker_init_fn past that end on purpose, so both bounds are waited out in full: they are
    # shortened here (how long they are, is not what this test checks)
    monkeypatch.setattr(starts, "START_HOLD_S", 0.2)
    monkeypatch.setattr(starts, "START_WAIT_S", 0.2)
    gate, held, log = tmp_path / "gate", tmp_path / "held", tmp_path / "calls"
    passed = tmp_path / "passed"
    held.mkdir()
    gate.touch()
    os.mkfifo(passed)
    passed_fd = os.open(passed, os.O_RDONLY | os.O_NONBLOCK)
    dataset = LoggedIndex(str(log))
    loader = hr.DataLoader(dataset, batch_size=4, num_workers=2, shuffle=shuffle,
                           worker_init_fn=_Init(str(gate), str(held), str(passed)), timeout=30,
                           persistent_workers=True)
    try:
        with open(gate) as g:
            fcntl.flock(g, fcntl.LOCK_EX)  # worker 1's worker_init_fn waits until released
            first = [int(v) for b in loader for v in torch.as_tensor(b).flatten()]
            assert sorted(first) == list(range(N))  # every sample, once, without worker 1
            assert len(os.listdir(held)) == 1  # which still waits in its worker_init_fn
            assert loader.stats().last.moved_samples == 2  # its first two, and no more
            fcntl.flock(g, fcntl.LOCK_UN)  # (the forked workers share this open file)
        ready, _, _ = select.select([passed_fd], [], [], 30)  # worker 1's init returns now
        assert ready and os.read(passed_fd, 1) == b"x"
        dataset.meet_now.set()  # epoch 2 runs on both workers
        second = [int(v) for b in loader for v in torch.as_tensor(b).flatten()]  # both work
        assert sorted(second) == list(range(N))
        calls = [line.split() for line in log.read_text().splitlines()]
        stuck = int(os.listdir(held)[0])
        assert stuck in {int(pid) for pid, _ in calls}  # worker 1 started and ran samples
        # each sample ran once an epoch: worker 1 skipped both samples moved off it
        assert collections.Counter(int(i) for _, i in calls) == {i: 2 for i in range(N)}
    finally:
        loader.close()
        os.close(passed_fd)
