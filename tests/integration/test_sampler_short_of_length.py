"""``loader.close()`` with a sampler whose ``__len__`` says more than it yields (an
undersampler: a filtering or class-balancing sampler that reports ``len(dataset)``): torch asks
that length only for ``len(loader)``, so it is a hint, and the epoch ends where the sampler does.

Closed after its last batch, its end not seen yet, ``num_workers=0`` raised
``LoaderClosedError`` saying 8 samples were not delivered (they never existed); with workers,
whose feed had read the sampler's end, the next ``next()`` was a ``StopIteration``.
"""

import pytest
import torch.utils.data as tud

import headrace as hr
from tests.helpers import ArraySource, noise

pytestmark = pytest.mark.integration

N, BS = 16, 4  # the sampler yields the 8 even indices: 2 batches, len(loader) says 4


class Undersampler(tud.Sampler):
    """Every other index; ``__len__`` says ``len(dataset)``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 2))

    def __len__(self):
        return self.n


def make(workers):
    pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)])
    return hr.DataLoader(pipe, sampler=Undersampler(N), batch_size=BS, num_workers=workers)


def indices(batch):
    return [int(v // 1) for v in batch.reshape(len(batch), -1)[:, 0].tolist()]


@pytest.mark.parametrize("workers", [0, 2])
def test_close_after_an_undersamplers_last_batch_ends_cleanly(workers, no_leaks):
    # (num_workers=2 is the reference: its feed read the sampler's end ahead of the batches)
    loader = make(workers)
    it = iter(loader)
    got = indices(next(it)) + indices(next(it))  # every batch; the end not read yet
    assert sorted(got) == list(range(0, N, 2))
    loader.close()
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(it)
    assert not loader.state_dict()["in_epoch"]  # between epochs: nothing is left of it
    assert sorted(i for b in loader for i in indices(b)) == list(range(0, N, 2))
    loader.close()
    # closed before its last batch it still says what was left (reading the sampler at
    # close to find its end must not hide a batch still to come), and resumes the rest
    loader = make(workers)
    it = iter(loader)
    first = indices(next(it))
    loader.close()
    with pytest.raises(hr.LoaderClosedError, match=r"part-way through epoch 0: 1 batch\(es\)"):
        next(it)
    loader.load_state_dict(loader.state_dict())
    rest = [i for b in loader for i in indices(b)]
    assert sorted(first + rest) == list(range(0, N, 2))
    loader.close()
