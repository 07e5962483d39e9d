"""Invariant 3 with an edited script: a state dict loaded into a loader built with other
settings resumes (with a warning naming each setting, then and now) where the rest of the epoch
is the same samples, and is refused where it would be other samples."""

import json
import re
from collections import Counter

import pytest
import torch

import headrace as hr
from tests.helpers import ArraySource, noise
from tests.integration.test_resume import rows

pytestmark = pytest.mark.integration


def loader(n, seed=5, **kw):
    pipe = hr.Pipeline(ArraySource(n), [hr.step(noise, random=True)])
    return hr.DataLoader(pipe, generator=torch.Generator().manual_seed(seed), **kw)


def saved_after(n, k, **kw):
    """The state dict (through JSON) after ``k`` batches of a loader built with ``kw``, and
    what that epoch had left: the (index, content) rows of an uninterrupted epoch less those
    the ``k`` batches delivered."""
    full = Counter(r for b in loader(n, **kw) for r in rows(b))
    first = loader(n, **kw)
    it = iter(first)
    before = Counter(r for _ in range(k) for r in rows(next(it)))
    state = json.loads(json.dumps(first.state_dict()))
    del it
    first.close()
    return state, full - before


SAME_SAMPLES = [  # (samples, saved with, resumed with, what the warning says)
    # the case that loaded silently: 10 batches an epoch either way
    (100, {"batch_size": 10}, {"batch_size": 11}, "batch_size=10 then, 11 now"),
    # 10 batches then, 8 now: refused before, though the same samples were left
    (40, {"batch_size": 4, "shuffle": True}, {"batch_size": 5, "shuffle": True},
     "batch_size=4 then, 5 now"),
    # drop_last leaves nothing out of 100 samples in batches of 10
    (100, {"batch_size": 10}, {"batch_size": 10, "drop_last": True},
     "drop_last=False then, True now"),
]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", SAME_SAMPLES, ids=lambda c: c[3])
def test_another_batching_of_the_same_samples_warns_and_resumes_the_rest(case, workers,
                                                                         no_leaks):
    n, then, now, words = case
    state, rest = saved_after(n, 3, num_workers=workers, **then)
    second = loader(n, seed=99, num_workers=workers, **now)
    with pytest.warns(UserWarning, match=re.escape(words)):
        second.load_state_dict(state)
    batches = [rows(b) for b in second]
    # exactly what the saved epoch had left, with the same content, in this loader's batches
    assert Counter(r for b in batches for r in b) == rest
    assert max(len(b) for b in batches) == now["batch_size"]
    second.close()


def test_another_batching_that_changes_the_epochs_samples_is_refused_mid_epoch(no_leaks):
    # 26 samples: batches of 4 with drop_last leave 2 out, batches of 5 without it none; both
    # are 6 batches an epoch, so the batch count did not tell (the rest gave those 2 too)
    state, _ = saved_after(26, 2, batch_size=4, drop_last=True)
    second = loader(26, batch_size=5)
    assert len(second) == state["batches_per_epoch"] == 6
    with pytest.raises(hr.StateDictError, match=re.escape(
            "epoch of 24 samples, this loader's epochs have 26 (batch_size=4 then, 5 now; "
            "drop_last=True then, False now): a resume would deliver samples the saved epoch "
            "left out")):
        second.load_state_dict(state)
    # between epochs nothing of an epoch is left: the next one runs with the new settings
    first = loader(26, batch_size=4, drop_last=True)
    list(first)
    state = json.loads(json.dumps(first.state_dict()))
    with pytest.warns(UserWarning, match=re.escape("24 samples per epoch then, 26 now")):
        second.load_state_dict(state)
    assert sorted(i for b in second for i, _ in rows(b)) == list(range(26))
    first.close()
    second.close()
