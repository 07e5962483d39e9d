"""Exact resume of a sampler that draws its order from Python's or NumPy's global generator
(``runtime/host_rngs.py``): a length-bucketing batch sampler shuffling with ``random.shuffle``,
a sampler permuting with ``np.random.permutation``; and a warning where a sampler does not
give the saved order again (``runtime/order_digest.py``)."""

import json
import random

import numpy as np
import pytest
import torch

import headrace as hr
from tests.helpers import ArraySource, IndexDataset, noise

pytestmark = pytest.mark.integration

N = 24


class NumpyOrder(torch.utils.data.Sampler):
    """A permutation from NumPy's global generator, drawn at the first element."""

    def __len__(self):
        return N

    def __iter__(self):
        yield from np.random.permutation(N).tolist()


class ShuffledBuckets:
    """Batches of 4 consecutive indices in an order from Python's global generator, drawn in
    ``__iter__`` itself (no batch_size attribute)."""

    def __len__(self):
        return N // 4

    def __iter__(self):
        batches = [list(range(s, s + 4)) for s in range(0, N, 4)]
        random.shuffle(batches)
        return iter(batches)


def loader(kind, workers):
    pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)])
    kw = ({"sampler": NumpyOrder(), "batch_size": 4} if kind == "numpy"
          else {"batch_sampler": ShuffledBuckets()})
    return hr.DataLoader(pipe, num_workers=workers, in_order=True,
                         generator=torch.Generator().manual_seed(3), **kw)


def rows(batch):
    return [round(v, 6) for v in batch.reshape(len(batch), -1)[:, 0].tolist()]


def training_draws():
    """What a training loop draws from the global generators between batches."""
    np.random.rand(3)
    random.random()


def seed():
    np.random.seed(0)
    random.seed(0)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["numpy", "python"])
def test_a_sampler_drawing_from_pythons_or_numpys_generator_resumes_exactly(
        kind, workers, no_leaks):
    """The state dict replayed the order from torch's generators alone: in a second epoch the
    resumed process's NumPy and Python generators were elsewhere than at the saved epoch's
    start, and the rest of the epoch came in another order: samples twice and others never."""
    seed()
    reference, full = loader(kind, workers), []
    for _ in range(2):
        full.append([])
        for b in reference:
            full[-1].append(rows(b))
            training_draws()
    reference.close()

    seed()
    first, before = loader(kind, workers), []
    for _ in first:  # the first epoch
        training_draws()
    it = iter(first)
    for _ in range(2):
        before.append(rows(next(it)))
        training_draws()
    state = json.loads(json.dumps(first.state_dict()))
    del it
    first.close()

    np.random.seed(99)  # a new process: its generators are elsewhere
    random.seed(99)
    second = loader(kind, workers)
    second.load_state_dict(state)
    it = iter(second)
    expected = np.random.get_state(legacy=False), random.getstate()
    after = [rows(next(it))]  # the replay's draws leave the loop's generators where they were
    assert _same(np.random.get_state(legacy=False), expected[0])
    assert random.getstate() == expected[1]
    after += [rows(b) for b in it]
    second.close()
    assert before + after == full[1]  # in order: the same samples, order and content


def test_a_sampler_that_draws_nothing_from_them_adds_nothing_to_the_state_dict(no_leaks):
    dl = hr.DataLoader(IndexDataset(N), batch_size=4, shuffle=True, num_workers=0)
    it = iter(dl)
    next(it)
    assert dl.state_dict()["epoch_host_rngs"] is None
    del it
    dl.close()


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(np.array_equal(a, b))


class LazyTorch(torch.utils.data.Sampler):
    """Each index drawn from torch's global generator as it is yielded (not replayable)."""

    def __len__(self):
        return N

    def __iter__(self):
        for _ in range(N):
            yield int(torch.randint(0, N, ()).item())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_that_does_not_replay_its_order_is_warned_of(workers, no_leaks):
    """It resumed into other samples at the delivered positions without a word."""
    def make():
        return hr.DataLoader(IndexDataset(N), sampler=LazyTorch(), batch_size=4,
                             num_workers=workers, in_order=True)

    torch.manual_seed(0)
    first = make()
    it = iter(first)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    assert state["order_digest"][0] >= 8
    del it
    first.close()
    torch.manual_seed(1)  # the loop drew on: the lazy draws after the first element differ
    second = make()
    second.load_state_dict(state)
    with pytest.warns(hr.ReplayOrderWarning, match="did not give the saved epoch's order"):
        rest = [b for b in second]
    second.close()
    assert len(rest) == 4
