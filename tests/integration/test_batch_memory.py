"""Batch memory reused across batches: kept batches stay intact, dropped ones are recycled."""

import multiprocessing as mp

import numpy as np
import torch
import torch.utils.data as tud

import headrace as hr


class Big(tud.Dataset):
    """1 MiB per sample, every value equal to the sample's index."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"x": np.full((256, 1024), i, dtype=np.float32), "index": i}


def test_kept_batches_are_never_overwritten():
    loader = hr.DataLoader(Big(), batch_size=4, shuffle=True, num_workers=2)
    kept = [b for _ in range(2) for b in loader]  # two epochs, every batch kept
    for b in kept:
        for row, i in enumerate(b["index"].tolist()):
            assert float(b["x"][row].min()) == float(b["x"][row].max()) == i
    assert sorted(i for b in kept for i in b["index"].tolist()) == sorted(list(range(24)) * 2)
    assert loader._buffers.reused == 0  # nothing was let go of


def test_batches_let_go_of_are_reused():
    loader = hr.DataLoader(Big(), batch_size=4, shuffle=True, num_workers=2)
    seen = []
    for _ in range(2):
        for b in loader:
            for row, i in enumerate(b["index"].tolist()):
                assert float(b["x"][row].min()) == float(b["x"][row].max()) == i
            seen += b["index"].tolist()
    assert sorted(seen) == sorted(list(range(24)) * 2)
    assert loader._buffers.reused > 0


def _sum_in_child(batch, out):
    out.put(float(batch["x"].numpy().sum()))  # NumPy: torch's OpenMP pool may hang after a fork


def test_a_kept_batch_is_read_whole_by_processes_forked_later():
    # a process the user forks (a parallel evaluation, the next loader's workers over a
    # dataset made of kept batches) read another mapping's bytes, or crashed, where a kept
    # batch's reused buffer lay (a bug hunt)
    ctx = mp.get_context("fork")
    loader = hr.DataLoader(Big(), batch_size=4, num_workers=2)
    first = None
    for b in loader:  # every batch but the first let go of: their buffers are reused
        first = b if first is None else first
    reused = next(b for i, b in enumerate(loader) if i == 1)  # over a buffer from the pool
    assert loader._buffers.reused > 0
    for batch in (first, reused):
        expected = float(batch["x"].numpy().sum())
        out = ctx.Queue()
        child = ctx.Process(target=_sum_in_child, args=(batch, out))
        child.start()
        child.join(60)
        assert child.exitcode == 0 and out.get(timeout=10) == expected
    # and the next loader's workers, given a dataset of the kept batch's rows
    rows = tud.TensorDataset(reused["x"], reused["index"])
    again = [b for b in hr.DataLoader(rows, batch_size=2, num_workers=2, in_order=True)]
    assert torch.equal(torch.cat([x for x, _ in again]), reused["x"])
