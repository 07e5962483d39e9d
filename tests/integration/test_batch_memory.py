"""Batch memory reused across batches: kept batches stay intact, dropped ones are recycled."""

import numpy as np
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
