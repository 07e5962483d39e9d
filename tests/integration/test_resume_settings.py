"""Invariant 3 with an edited script: a state dict loaded into a loader built with other
settings resumes (with a warning naming each setting, then and now) where the rest of the epoch
is the same samples, and is refused where it would be other samples."""

import json
import re
from collections import Counter

import pytest
import torch

import headrace as hr
from headrace.runtime.state_checks import IDENTITY_VERSION
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


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("then", [True, False])
def test_another_shuffle_part_way_through_an_epoch_is_refused(then, workers, no_leaks):
    # what it delivered, unrefused: the positions left of the saved order, read in the other
    # order (after 3 batches of 4 out of 40, 8 samples came twice and 8 never)
    state, _ = saved_after(40, 3, batch_size=4, shuffle=then, num_workers=workers)
    second = loader(40, seed=99, batch_size=4, shuffle=not then, num_workers=workers)
    with pytest.raises(hr.StateDictError, match=re.escape(
            f"saved part-way through an epoch with shuffle={then}, this loader has "
            f"shuffle={not then}")):
        second.load_state_dict(state)
    second.close()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("taken", [0, 10])
def test_another_shuffle_before_an_epochs_first_batch_or_after_its_last_warns(taken, workers,
                                                                                no_leaks):
    state, rest = saved_after(40, taken, batch_size=4, shuffle=True, num_workers=workers)
    # (after the last batch the state is the one between epochs: nothing of it is left)
    assert state["in_epoch"] == (taken == 0) and sum(rest.values()) == 40 - 4 * taken
    second = loader(40, seed=99, batch_size=4, shuffle=False, num_workers=workers)
    with pytest.warns(UserWarning, match=re.escape("shuffle=True then, False now")):
        second.load_state_dict(state)
    got = [r for b in second for r in rows(b)]
    if taken == 0:
        assert Counter(got) == rest  # the whole epoch, with the saved run's content
    assert [i for i, _ in got] == list(range(40))  # (after the last batch: the next epoch)
    second.close()


def test_a_state_dict_whose_identities_were_computed_otherwise_is_not_told_as_changed(no_leaks):
    """Identities computed by an older headrace (before ``identity_version``) differ from
    today's for the same code: after an upgrade every resume said its steps and dataset had
    changed. Such a state dict is compared by what decides the samples only."""
    import warnings

    state, rest = saved_after(26, 2, batch_size=4)
    assert state["identity_version"] == IDENTITY_VERSION == 5
    edited = dict(state, step_code={k: "0" + v for k, v in state["step_code"].items()},
                  dataset="another")
    second = loader(26, seed=99, batch_size=4)
    with pytest.warns(UserWarning, match="steps changed: noise"):  # today's: told
        second.load_state_dict(edited)
    second.close()
    # before identity_version (1), 2: before a step's helpers and the scalar globals they and
    # a callable class's methods read were counted, 3: before a dataset's class code was,
    # 4: before a container's items past the 64th were
    for old in ({k: v for k, v in edited.items() if k != "identity_version"},
                dict(edited, identity_version=2), dict(edited, identity_version=3),
                dict(edited, identity_version=4)):
        third = loader(26, seed=99, batch_size=4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            third.load_state_dict(old)
        assert Counter(r for b in third for r in rows(b)) == rest
        third.close()
