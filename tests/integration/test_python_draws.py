"""A ``__getitem__`` drawing from Python's ``random``: the runner seeds Python's generator only
before the steps known to draw from it, and a step's first draw runs its sample again, seeded
(``pipeline/runner.py``). What is learned outlives the worker processes and the epoch
(``runtime/python_draws.py``): with workers that start anew each epoch, and with
``num_workers=0``, only the first epoch pays for it."""

import multiprocessing as mp
import random

import pytest

import headrace as hr
from headrace.pipeline.seeding import sample_root, step_seed

pytestmark = pytest.mark.integration

SAMPLES = 16
EPOCHS = 3


class CountingDraws:
    """``dataset[i]``: ``(i, random.random())``, each call counted in shared memory (workers
    are processes)."""

    def __init__(self) -> None:
        self.calls = mp.get_context("fork").Value("q", 0)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> tuple[int, float]:
        with self.calls.get_lock():
            self.calls.value += 1
        return i, random.random()


def seeded(base_seed: int, epoch: int, index: int, key: int) -> float:
    """What ``dataset[index]`` gives with Python's generator seeded before it, as every run
    that seeds every step does (``seeding.seed_globals``)."""
    return random.Random(step_seed(sample_root(base_seed, epoch, index), key)).random()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("num_workers", [2, 0])
def test_a_drawing_getitem_runs_once_more_in_the_first_epoch_only(num_workers):
    ds = CountingDraws()
    loader = hr.DataLoader(ds, batch_size=4, num_workers=num_workers,
                           options=hr.Options(profile_store=False, cache=None, seed=3))
    assert loader.pipeline is not None
    key = loader.pipeline.keys[0]  # the dataset's __getitem__ is step 0, ``load``
    calls = []
    for _ in range(EPOCHS):
        before = ds.calls.value
        it = iter(loader)
        got = {}
        for idx, values in it:
            got.update(zip(idx.tolist(), values.tolist(), strict=True))
        calls.append(ds.calls.value - before)
        base_seed, epoch = it.origin.base_seed, it.origin.epoch
        # the content is what seeding before every call gives, whichever run flagged the step
        assert got == {i: seeded(base_seed, epoch, i, key) for i in range(SAMPLES)}
    # the first epoch: one call more per worker process that ran a sample before it knew
    # (in-process: exactly one); later epochs' workers are told from the start
    assert SAMPLES < calls[0] <= SAMPLES + max(1, num_workers), calls
    assert calls[1:] == [SAMPLES] * (EPOCHS - 1), calls
