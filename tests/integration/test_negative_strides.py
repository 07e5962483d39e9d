"""A NumPy sample with negative strides (``a[::-1]``) fails to collate from workers as it does
with ``num_workers=0`` and under torch (``torch.as_tensor`` refuses negative strides): the
ring and pickling used to deliver a contiguous copy, so a script tested with workers broke
when debugged with ``num_workers=0``."""

import numpy as np
import pytest
import torch

from headrace.runtime import DataLoader

pytestmark = pytest.mark.integration


class Reversed(torch.utils.data.Dataset):
    def __init__(self, n: int, flat: bool = True) -> None:
        self.n, self.flat = n, flat

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        if self.flat:
            return np.arange(self.n)[::-1]
        # backwards along an axis of size 1: NumPy flags it C-contiguous, torch refuses it
        return np.arange(self.n, dtype=np.float64).reshape(1, self.n)[::-1]


@pytest.mark.parametrize("n", [5, 300_000])  # inline, and over the inline limit (2.4 MB)
@pytest.mark.parametrize("flat", [True, False], ids=["reversed", "size-1-axis"])
@pytest.mark.parametrize("workers", [0, 2])
def test_negative_strides_fail_to_collate_as_under_torch(n, flat, workers, no_leaks):
    with pytest.raises(ValueError, match="negative"):  # torch's, as its workers raise it too
        # (an iterator of its workers left by the error takes 10 s to shut down)
        next(iter(torch.utils.data.DataLoader(Reversed(n, flat), batch_size=2)))
    context = {"multiprocessing_context": "fork", "timeout": 120} if workers else {}
    loader = DataLoader(Reversed(n, flat), batch_size=2, num_workers=workers, **context)
    with pytest.raises(ValueError, match="negative"):
        next(iter(loader))
    loader.close()


def test_a_custom_collate_gets_the_negative_strides(no_leaks):
    seen = []

    def collate(samples):
        seen.extend(s.strides for s in samples)
        return np.stack(samples)

    loader = DataLoader(Reversed(5), batch_size=2, num_workers=2, collate_fn=collate,
                        multiprocessing_context="fork", timeout=120)
    batches = list(loader)
    assert all(np.array_equal(b, [[4, 3, 2, 1, 0]] * 2) for b in batches)
    assert seen and all(st[0] < 0 for st in seen), seen
