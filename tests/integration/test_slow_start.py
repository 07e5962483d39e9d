"""A worker whose ``worker_init_fn`` does not return does not hold the epoch: the samples it
got before it was ready move to a worker that is ready and idle, each delivered once."""

from __future__ import annotations

import fcntl
import os

import pytest
import torch

import headrace as hr
from tests.helpers import IndexDataset, wait_at_gate

pytestmark = pytest.mark.integration


class _Init:
    """``worker_init_fn``: worker 1 waits at the gate (leaving its pid in ``held``)."""

    def __init__(self, gate: str, held: str) -> None:
        self.gate, self.held = gate, held

    def __call__(self, worker_id: int) -> None:
        if worker_id == 1:
            wait_at_gate(self.gate, self.held)


@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_ends_while_a_worker_is_still_in_its_worker_init_fn(tmp_path, no_leaks,
                                                                    shuffle):
    gate, held = tmp_path / "gate", tmp_path / "held"
    held.mkdir()
    gate.touch()
    with open(gate) as g:
        fcntl.flock(g, fcntl.LOCK_EX)  # worker 1's worker_init_fn waits until released
        loader = hr.DataLoader(IndexDataset(48), batch_size=4, num_workers=2, shuffle=shuffle,
                               worker_init_fn=_Init(str(gate), str(held)), timeout=30)
        try:
            got = [int(v) for b in loader for v in torch.as_tensor(b).flatten()]
            assert sorted(got) == list(range(48))  # every sample, once, without worker 1
            assert len(os.listdir(held)) == 1  # which still waits in its worker_init_fn
            assert loader.stats().last.moved_samples >= 1  # its first samples moved to worker 0
        finally:
            fcntl.flock(g, fcntl.LOCK_UN)
            loader.close()
