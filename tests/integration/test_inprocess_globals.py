"""``num_workers=0`` runs the samples' steps in the training thread, re-seeding Python's,
NumPy's and torch's global generators for them (``pipeline/seeding.py``): the training loop's
own draws from those generators between batches are the ones it makes without a loader, also
when a sample fails part-way through a batch (``runtime/inprocess.py`` puts the generators
back once a batch's samples ran, not after each sample)."""

import random

import numpy as np
import pytest
import torch

import headrace as hr

pytestmark = pytest.mark.integration


class DrawsEverywhere:
    """``dataset[i]``: draws from the three global generators; ``bad`` raises after drawing."""

    def __init__(self, n: int, bad: int | None = None) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float, float, float]:
        a, b, c = random.random(), float(np.random.rand()), float(torch.rand(()))
        if i == self.bad:
            raise ValueError(f"sample {i} is bad")
        return i, a, b, c


def loop_draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def run(ds: DrawsEverywhere, workers: int, on_error: str = "raise") -> tuple[list, list]:
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    loader = hr.DataLoader(ds, batch_size=4, num_workers=workers,
                           options=hr.Options(profile_store=False, cache=None, seed=5,
                                              on_error=on_error))
    drawn, samples = [], []
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except hr.StepError:
            drawn.append(loop_draws())  # the loop goes on after a failed batch
            continue
        samples += list(zip(*(t.tolist() for t in batch), strict=True))
        drawn.append(loop_draws())
    return drawn, samples


def without_loader(times: int) -> list:
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    return [loop_draws() for _ in range(times)]


@pytest.mark.timeout(120)
def test_the_loops_draws_are_its_own_and_samples_match_the_workers():
    drawn, samples = run(DrawsEverywhere(12), 0)
    assert drawn == without_loader(len(drawn)) and len(drawn) == 3
    _, with_workers = run(DrawsEverywhere(12), 2)
    assert sorted(samples) == sorted(with_workers) and len(samples) == 12


@pytest.mark.timeout(120)
def test_a_sample_failing_mid_batch_leaves_the_loops_generators_as_they_were():
    drawn, samples = run(DrawsEverywhere(12, bad=5), 0)
    assert drawn == without_loader(len(drawn)) and len(drawn) == 3
    assert [s[0] for s in samples] == [0, 1, 2, 3, 8, 9, 10, 11]  # 4-7 went with sample 5


@pytest.mark.timeout(120)
def test_a_sample_listener_draws_from_the_loops_generators():
    # add_sample_listener's callbacks (and a logging handler under on_error="skip") are user
    # code: they run with the loop's generators, not a sample's seeded ones, and keep their draws
    loader = hr.DataLoader(DrawsEverywhere(12, bad=5), batch_size=4, num_workers=0,
                           options=hr.Options(profile_store=False, cache=None, seed=5,
                                              on_error="skip"))
    heard = []
    loader.add_sample_listener(lambda index, seconds, slow: heard.append(random.random()))
    random.seed(11)
    for _ in loader:
        pass
    random.seed(11)
    assert heard == [random.random() for _ in range(11)]  # 11 samples: one was skipped


class ListenerFailed(Exception):
    pass


@pytest.mark.timeout(120)
def test_a_listener_that_raises_loses_no_other_samples_hooks_nor_a_samples_error():
    # called one by one after the restore, a hook that raised lost the later samples' hooks,
    # and replaced the StepError of a sample failing in the same batch (a review)
    loader = hr.DataLoader(DrawsEverywhere(8), batch_size=4, num_workers=0,
                           options=hr.Options(profile_store=False, cache=None, seed=5))
    heard = []

    def listener(index, seconds, slow):
        heard.append(index)
        if index == 1:
            raise ListenerFailed(index)

    loader.add_sample_listener(listener)
    it = iter(loader)
    with pytest.raises(ListenerFailed):
        next(it)
    assert heard == [0, 1, 2, 3]  # every sample's hook ran, the first error raised after
    loader.close()
    heard.clear()
    failing = hr.DataLoader(DrawsEverywhere(8, bad=2), batch_size=4, num_workers=0,
                            options=hr.Options(profile_store=False, cache=None, seed=5))
    failing.add_sample_listener(listener)
    with pytest.raises(hr.StepError, match="sample 2 is bad"):
        next(iter(failing))
    assert heard == [0, 1]
    failing.close()
