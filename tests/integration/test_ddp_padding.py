"""A DDP rank's padding under ``on_error="skip"`` (``runtime/padding.py``): every rank takes
``len(loader)`` batches an epoch, through a resume in a new process too, or says why it cannot.

Ranks are ``DistributedSampler(num_replicas=2, rank=r)`` without a process group, one loader
each: rank 0 holds the even indices of 8, rank 1 the odd ones; batches of 2, so 2 a rank. The
content carries a per-sample random draw, so a repeated batch is compared with its seeds.
"""

import gc
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import headrace as hr
from tests.helpers import ArraySource, noise

pytestmark = pytest.mark.integration


class Bad:
    """Fails on the indices it is given (a corrupt sample)."""

    def __init__(self, bad):
        self.bad = frozenset(bad)

    def __call__(self, x):
        if int(x[0]) in self.bad:
            raise ValueError(f"corrupt {int(x[0])}")
        return x


def rank_loader(rank, bad, workers, n=8):
    from torch.utils.data.distributed import DistributedSampler

    pipe = hr.Pipeline(ArraySource(n), [hr.step(Bad(bad), name="bad"),
                                        hr.step(noise, random=True)])
    sampler = DistributedSampler(pipe, num_replicas=2, rank=rank, shuffle=False)
    return hr.DataLoader(pipe, batch_size=2, sampler=sampler, num_workers=workers,
                         options=hr.Options(seed=5, on_error="skip", profile_store=False))


def rows(batch):
    """(index, content) pairs of a batch; content carries the per-sample random draw."""
    return [(int(np.floor(v)), round(v, 6)) for v in batch.reshape(len(batch), -1)[:, 0].tolist()]


def epochs(loader, count):
    """Each epoch's batches (as rows), ``count`` epochs, quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [[rows(b) for b in loader] for _ in range(count)]


def resumed_in_a_new_process(tmp_path, state, bad, workers, count=2):
    """``count`` epochs of a new process's rank-0 loader given ``state``."""
    (tmp_path / "state.json").write_text(json.dumps(state))
    script = textwrap.dedent(f"""
        import json, sys, warnings
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from tests.integration.test_ddp_padding import epochs, rank_loader
        loader = rank_loader(0, {sorted(bad)!r}, {workers})
        loader.load_state_dict(json.loads(open({str(tmp_path / "state.json")!r}).read()))
        print(json.dumps(epochs(loader, {count})))
        loader.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    return [[[tuple(r) for r in b] for b in e] for e in json.loads(out.stdout)]


def saved_after(loader, k, drop_iterator=False):
    """The state after ``k`` batches of the first epoch (through JSON) and those batches."""
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = [rows(next(it)) for _ in range(k)]
    if drop_iterator:  # the loop left: state_dict() describes where it stopped
        del it
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state, before


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_rank_whose_rest_was_skipped_repeats_its_last_batch(tmp_path, workers, no_leaks):
    # 4 and 6 fail: rank 0 delivers [0, 2] and repeats it. Resumed after [0, 2], the new
    # process delivered nothing more and had no batch of its own to repeat: 1 batch where
    # every rank takes 2 (a DDP hang at the next collective)
    bad = {4, 6}
    full = epochs(rank_loader(0, bad, workers), 2)
    assert [len(e) for e in full] == [2, 2] and full[0][0] == full[0][1]
    state, before = saved_after(rank_loader(0, bad, workers), 1)
    assert state["in_epoch"]
    after = resumed_in_a_new_process(tmp_path, state, bad, workers)
    assert [before + after[0], after[1]] == full  # the repeat has the same content (seeds)


@pytest.mark.parametrize("drop_iterator", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_whose_samples_are_all_settled_still_owes_the_padding(tmp_path, workers,
                                                                      drop_iterator, no_leaks):
    # 0 and 2 fail first: after [4, 6] every position is settled, and the state was the one
    # between epochs (epoch 1): the padding batch epoch 0 owed was lost, the resumed iter()
    # started epoch 1. Also when the loop left before state_dict() (the abandoned epoch's state)
    bad = {0, 2}
    full = epochs(rank_loader(0, bad, workers), 2)
    state, before = saved_after(rank_loader(0, bad, workers), 1, drop_iterator)
    assert (state["epoch"], state["in_epoch"], state["batches_delivered"]) == (0, True, 1)
    after = resumed_in_a_new_process(tmp_path, state, bad, workers)
    assert [before + after[0], after[1]] == full


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_between_two_padding_batches_owes_the_rest(tmp_path, workers, no_leaks):
    # 12 samples, 6 a rank, 3 batches; rank 0's last four fail: [0, 2], then two repeats.
    # After the first repeat the epoch's own iterator had ended: the state was between epochs
    bad = {4, 6, 8, 10}

    def loader():
        return rank_loader(0, bad, workers, n=12)

    full = epochs(loader(), 1)[0]
    assert len(full) == 3 and full[0] == full[1] == full[2]
    state, before = saved_after(loader(), 2)
    assert (state["in_epoch"], state["batches_delivered"]) == (True, 2)
    resumed = loader()
    resumed.load_state_dict(state)
    assert before + epochs(resumed, 1)[0] == full
    resumed.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_rank_whose_every_sample_is_skipped_raises_naming_the_rank(workers, no_leaks):
    # it gave 0 batches without a word, where every other rank takes 2 (a hang)
    loader = rank_loader(0, {0, 2, 4, 6}, workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(hr.UnevenRanksError, match=r"rank 0 of 2 .* 2 batches .* epoch 0: "
                                                       r"on_error='skip' skipped every sample"):
            list(loader)
    assert len(epochs(rank_loader(1, {0, 2, 4, 6}, workers), 1)[0]) == 2  # its peer's
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loop_left_while_padding_is_owed_resumes_the_rest_whatever_the_collector_did(
        workers, no_leaks):
    """Rank 0's own samples fill 1 of its 4 batches (16 samples, 6 of its 8 bad): 3 repeats.
    The loop is left after k batches and the padding wrapper collected before state_dict():
    the state said "between epochs" (the epoch's own batches had ended, and the debt lived only
    in the wrapper), and the resume gave 4 batches of epoch 1 where the others resume the rest
    of epoch 0 (a review; whether it happened depended on the garbage collector)."""
    bad = [4, 6, 8, 10, 12, 14]
    for k in (1, 2, 3):
        loader = rank_loader(0, bad, workers, n=16)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for taken, _ in enumerate(loader, start=1):
                if taken == k:
                    break
        gc.collect()
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        assert (state["epoch"], state["in_epoch"], state["batches_delivered"]) == (0, True, k)
        again = rank_loader(0, bad, workers, n=16)
        again.load_state_dict(state)
        try:
            assert len(epochs(again, 1)[0]) == 4 - k
        finally:
            again.close()


def test_a_resumed_epoch_whose_rest_is_padding_warns_of_the_padding_only():
    """The rest of the epoch after the resume is its 3 repeats: the warning named "the 3 every
    rank takes" (what was left, where len(loader) is 4), and the all-skipped check said the
    epoch "delivered no batch after its resume ... none reached the training loop" although
    the 3 repeats did (a review)."""
    bad = [4, 6, 8, 10, 12, 14]
    loader = rank_loader(0, bad, 0, n=16)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    again = rank_loader(0, bad, 0, n=16)
    again.load_state_dict(state)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert len([b for b in again]) == 3
    finally:
        again.close()
    texts = [str(w.message) for w in seen]
    assert any("3 batch(es) short of the 4 every rank takes" in t for t in texts), texts
    assert not any("delivered no batch" in t for t in texts), texts


@pytest.mark.parametrize("how", ["close", "load_state_dict"])
def test_an_iterator_in_its_padding_stops_once_the_loader_is_closed_or_reloaded(how):
    """Every later next() raises LoaderClosedError once loader.close() or load_state_dict()
    stopped the epoch part-way (docs/reliability.md); an iterator in its padding went on
    repeating batches (2 more, a review): the epoch had closed, so nothing halted it."""
    loader = rank_loader(0, [4, 6, 8, 10, 12, 14], 0, n=16)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        next(it)
        next(it)  # its own batch, then the first of 3 repeats
    try:
        if how == "close":
            loader.close()
        else:
            loader.load_state_dict(json.loads(json.dumps(loader.state_dict())))
        with pytest.raises(hr.LoaderClosedError):
            next(it)
    finally:
        loader.close()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("taken", [2, 3])
def test_loader_closed_error_in_the_padding_counts_the_repeats(workers, taken, no_leaks):
    """Rank 0 of 16 samples, 6 of its 8 skipped: 1 batch of its own, then 3 repeats of it. The
    message said "1 batch(es) were delivered, and 3 of its 4 batches (0 samples) were not"
    after a repeat too: it counted the rank's own batches, not the repeats it yielded."""
    loader = rank_loader(0, [4, 6, 8, 10, 12, 14], workers, n=16)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(taken):  # its own batch, then 1 or 2 repeats
            next(it)
    loader.close()
    repeats = taken - 1
    with pytest.raises(hr.LoaderClosedError) as ei:
        next(it)
    text = str(ei.value)
    assert f"part-way through epoch 0: {taken} batch(es) were delivered" in text, text
    assert f"({repeats} of them its last batch repeated" in text, text
    assert (f"and {4 - taken} of its 4 batches (repeats of its last batch, no sample) were not"
            in text), text
