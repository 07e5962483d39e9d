"""Invariant 3 with an edited script: a state dict loaded into a loader built with other
settings resumes (with a warning naming each setting, then and now) where the rest of the epoch
is the same samples, and is refused where it would be other samples."""

import json
import re
import warnings
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


@pytest.mark.parametrize("then", [True, False])
@pytest.mark.parametrize("taken", [2, 5])  # part-way; after the last of 5 batches
def test_another_persistent_workers_warns_and_resumes_the_rest(then, taken, no_leaks):
    # torch draws the workers' base seed once when they persist, at every epoch otherwise: a
    # resume with the other setting gave later epochs other seeds (and the loader's generator
    # other draws, so a shuffle another order) without a word, where batch_size warned
    kw = {"batch_size": 4, "shuffle": True, "num_workers": 1}
    state, rest = saved_after(20, taken, persistent_workers=then, **kw)
    assert state["in_epoch"] == (taken < 5)
    second = loader(20, seed=99, persistent_workers=not then, **kw)
    with pytest.warns(UserWarning, match=re.escape(
            f"persistent_workers={then} then, {not then} now")):
        second.load_state_dict(state)
    if taken < 5:
        assert Counter(r for b in second for r in rows(b)) == rest  # the rest, exactly
    second.close()
    same = loader(20, seed=99, persistent_workers=then, **kw)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        same.load_state_dict(state)
    assert not [w for w in seen if "persistent_workers" in str(w.message)]
    same.close()


def test_a_state_dict_whose_identities_were_computed_otherwise_is_not_told_as_changed(no_leaks):
    """Identities computed by an older headrace (before ``identity_version``) differ from
    today's for the same code: after an upgrade every resume said its steps and dataset had
    changed. Such a state dict is compared by what decides the samples only."""
    import warnings

    state, rest = saved_after(26, 2, batch_size=4)
    assert state["identity_version"] == IDENTITY_VERSION == 6
    edited = dict(state, step_code={k: "0" + v for k, v in state["step_code"].items()},
                  dataset="another")
    second = loader(26, seed=99, batch_size=4)
    with pytest.warns(UserWarning, match="steps changed: noise"):  # today's: told
        second.load_state_dict(edited)
    second.close()
    # before identity_version (1), 2: before a step's helpers and the scalar globals they and
    # a callable class's methods read were counted, 3: before a dataset's class code was,
    # 4: before a container's items past the 64th were, 5: before state past six levels was
    for old in ({k: v for k, v in edited.items() if k != "identity_version"},
                dict(edited, identity_version=2), dict(edited, identity_version=3),
                dict(edited, identity_version=4), dict(edited, identity_version=5)):
        third = loader(26, seed=99, batch_size=4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            third.load_state_dict(old)
        assert Counter(r for b in third for r in rows(b)) == rest
        third.close()


def ranked(rank, seed, epoch, workers, in_order):
    """Rank ``rank`` of 2 (``DistributedSampler`` without a process group) over 26 samples,
    its sampler given ``seed`` and ``set_epoch(epoch)`` as a training script does."""
    from torch.utils.data.distributed import DistributedSampler

    pipe = hr.Pipeline(ArraySource(26), [hr.step(noise, random=True)])
    sampler = DistributedSampler(pipe, num_replicas=2, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return hr.DataLoader(pipe, batch_size=3, sampler=sampler, num_workers=workers,
                         in_order=in_order, generator=torch.Generator().manual_seed(7))


def saved_mid_epoch(first, k):
    """The state dict (through JSON) after ``k`` batches of loader ``first`` (closed then),
    and the rows those batches delivered."""
    it = iter(first)
    before = [r for _ in range(k) for r in rows(next(it))]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    first.close()
    return state, before


@pytest.mark.parametrize(("workers", "in_order"), [(0, True), (2, False)])
@pytest.mark.parametrize("changed", ["seed", "epoch"])
def test_a_distributed_sampler_given_another_seed_or_epoch_finishes_the_saved_epoch_once(
        changed, workers, in_order, no_leaks):
    # saved part-way with seed=1, set_epoch(4); resumed with seed=2 (or set_epoch(0): a new
    # process counting epochs from 0): the state dict held positions over the saved order,
    # read over another one, so the two ranks delivered some samples twice and others never,
    # and the warning blamed a sampler drawing its order as it goes
    later = {"seed": (2, 4), "epoch": (1, 0)}[changed]
    said = {"seed": "seed=2 now, 1 when the state dict was saved",
            "epoch": "set_epoch(0) now, set_epoch(4) when it was saved"}[changed]
    epoch = []
    for rank in (0, 1):
        full = [r for b in ranked(rank, 1, 4, workers, in_order) for r in rows(b)]
        state, before = saved_mid_epoch(ranked(rank, 1, 4, workers, in_order), 2)
        assert state["epoch_sampler_seeds"] == [[1, 4]]  # what its order was drawn with
        second = ranked(rank, *later, workers, in_order)
        second.load_state_dict(state)
        with pytest.warns(UserWarning, match=re.escape(said)):
            it = iter(second)
        middle = rows(next(it))
        state = json.loads(json.dumps(second.state_dict()))  # saved again, in the resumed epoch
        del it
        second.close()
        third = ranked(rank, 3, later[1], workers, in_order)  # and resumed with yet another seed
        third.load_state_dict(state)
        with pytest.warns(UserWarning, match=re.escape("seed=3 now, 1 when")):
            after = [r for b in third for r in rows(b)]
        got = before + middle + after
        assert Counter(got) == Counter(full)  # the saved epoch's samples, with their content
        if in_order:
            assert got == full
        epoch += [i for i, _ in got]
        # the epochs after it are the script's: its seed, the epoch set_epoch gives
        third.sampler.set_epoch(later[1] + 1)
        nxt = [i for b in third for i, _ in rows(b)]
        assert sorted(nxt) == sorted(third.sampler) and (nxt == list(third.sampler)
                                                         or not in_order)
        assert (third.sampler.seed, third.sampler.epoch) == (3, later[1] + 1)
        third.close()
    assert sorted(epoch) == list(range(26))  # exactly once over the two ranks


def test_a_distributed_samplers_state_resumes_exactly_in_a_new_process_with_another_seed(
        tmp_path, no_leaks):
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    done = []
    for rank in (0, 1):
        state, before = saved_mid_epoch(ranked(rank, 1, 0, 2, False), 2)
        (tmp_path / f"state{rank}.json").write_text(json.dumps(state))
        done += [tuple(r) for r in before]
    script = textwrap.dedent(f"""
        import json, sys, warnings
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from tests.integration.test_resume import rows
        from tests.integration.test_resume_settings import ranked
        out = []
        for rank in (0, 1):
            loader = ranked(rank, 2, 0, 1, False)
            loader.load_state_dict(json.loads(open({str(tmp_path)!r} + f"/state{{rank}}.json").read()))
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                out += [r for b in loader for r in rows(b)]
            out += [["warned", str(w.message)] for w in said]
            loader.close()
        print(json.dumps(out))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    said = [m for tag, m in out if tag == "warned"]
    resumed = [tuple(r) for r in out if r[0] != "warned"]
    full = [r for rank in (0, 1) for b in ranked(rank, 1, 0, 0, False) for r in rows(b)]
    assert Counter(done + resumed) == Counter(full)
    assert sorted(i for i, _ in done + resumed) == list(range(26))  # exactly once
    assert len(said) == 2 and all("seed=2 now, 1 when the state dict was saved" in m
                                  for m in said)


def test_an_older_distributed_state_without_the_samplers_seed_loads_and_names_it(no_leaks):
    # a state dict saved before epoch_sampler_seeds: the same seed resumes exactly, as it did;
    # another one cannot be replayed, and the warning names the seed, not a sampler drawing
    # as it goes
    import warnings

    full = [r for b in ranked(0, 1, 4, 0, True) for r in rows(b)]
    state, before = saved_mid_epoch(ranked(0, 1, 4, 0, True), 2)
    older = {k: v for k, v in state.items() if k != "epoch_sampler_seeds"}
    same = ranked(0, 1, 4, 0, True)
    same.load_state_dict(older)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert before + [r for b in same for r in rows(b)] == full
    same.close()
    other = ranked(0, 2, 4, 0, True)
    other.load_state_dict(older)
    with pytest.warns(hr.ReplayOrderWarning, match="does not record the DistributedSampler's "
                      "seed and epoch"):
        list(other)
    other.close()
