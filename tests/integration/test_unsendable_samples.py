"""Samples that cannot leave their worker process, values the transport must still carry, and
epochs whose every sample was skipped."""

import os
import threading
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from tests.helpers import FailingDataset, Twice, ident_collate, stop_torch_workers

pytestmark = pytest.mark.integration


class LockSamples(tud.Dataset):
    """``(i, a lock)``: the lock does not pickle; ``first_only`` keeps what does."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return i, threading.Lock()


def first_only(batch):
    return torch.tensor([s[0] for s in batch])


def test_a_sample_that_does_not_pickle_names_the_cause_and_a_fix_that_works(no_leaks):
    # torch's workers collate before pickling, so this runs there; headrace's error told the
    # user to pass on_error='skip', which dropped every sample and delivered an empty epoch
    loader = hr.DataLoader(LockSamples(), batch_size=2, num_workers=2, collate_fn=first_only)
    try:
        with pytest.raises(hr.StepError) as info:
            list(loader)
    finally:
        loader.close()
    text = str(info.value)
    assert info.value.step == "transport" and "cannot pickle" in text
    assert "collates batches in the training process" in text
    assert "Options(executor='threads')" in text and "on_error='skip'" not in text
    threads = hr.DataLoader(LockSamples(), batch_size=2, num_workers=2, collate_fn=first_only,
                            options=hr.Options(executor="threads"))
    try:  # the fix it names gives torch's batches
        assert [b.tolist() for b in threads] == [[0, 1], [2, 3], [4, 5]]
    finally:
        threads.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_an_epoch_whose_every_sample_was_skipped_warns_at_its_end(workers, no_leaks):
    # on_error='skip' over a dataset whose every sample fails: the epoch yielded nothing, raised
    # nothing, and only logged its first skip; a training loop ran on it without knowing
    if workers:
        ds, collate, step = LockSamples(), first_only, "'transport'"
    else:
        ds, collate, step = FailingDataset(6, set(range(6))), None, "'load'"
    loader = hr.DataLoader(ds, batch_size=2, num_workers=workers, collate_fn=collate,
                           options=hr.Options(on_error="skip"))
    try:  # the first such epoch warns (the next ones: tests/integration/test_warning_lines.py)
        with pytest.warns(UserWarning, match="epoch 0 delivered no batch") as got:
            assert list(loader) == []
        text = str(got[0].message)
        assert "6 sample(s) were skipped" in text and f"step {step} failed" in text
        assert "sample index" in text
    finally:
        loader.close()
    some = hr.DataLoader(FailingDataset(6, {0, 3}), batch_size=2, num_workers=workers,
                         options=hr.Options(on_error="skip"))
    try:  # an epoch that delivered something does not warn
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert sorted(i for b in some for i in b.tolist()) == [1, 2, 4, 5]
    finally:
        some.close()


def _resumed_before_its_bad_rest():
    """A loader over 8 samples, 6 and 7 bad (``on_error="skip"``, ``num_workers=0``), resumed
    from a state taken after the loop saw samples 0-5: with ``num_workers=0`` a sample runs
    inside ``next()``, so the bad ones have not run (deterministic; workers may settle them
    first, and the state is then between epochs)."""
    def make():
        return hr.DataLoader(FailingDataset(8, {6, 7}), batch_size=2, num_workers=0,
                             options=hr.Options(on_error="skip"))

    first = make()
    try:
        it = iter(first)
        assert [next(it).tolist() for _ in range(3)] == [[0, 1], [2, 3], [4, 5]]
        state = first.state_dict()
        del it
    finally:
        first.close()
    resumed = make()
    resumed.load_state_dict(state)
    return resumed


def test_a_resumed_epoch_whose_rest_was_skipped_says_what_it_delivered_before(no_leaks):
    # the resume runs the bad samples, skips them and delivers nothing. Its warning said the
    # epoch delivered no batch and blamed the dataset, though 6 samples had reached the loop.
    # Every epoch closes through EpochBase.close alike
    resumed = _resumed_before_its_bad_rest()
    try:
        with pytest.warns(UserWarning, match="epoch 0 delivered no batch after its resume") as got:
            assert list(resumed) == []
        text = str(got[0].message)
        assert "2 sample(s) were skipped" in text and "6 sample(s) before the resume" in text
        assert "sample index 6" in text and "usually the dataset" not in text
    finally:
        resumed.close()


def test_an_all_skipped_epoch_after_a_resumed_rest_was_warned_of_warns_too(no_leaks):
    # the resumed epoch's rest, all skipped, was the loader's one empty-epoch warning: a later
    # epoch whose every sample was skipped (here the data went bad: every read fails) said
    # nothing, although it is the dataset or a step failing, not a resume running bad samples
    resumed = _resumed_before_its_bad_rest()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert list(resumed) == []  # epoch 0's rest: samples 6 and 7, both bad
            resumed.dataset.bad = set(range(8))
            assert list(resumed) == [] and list(resumed) == []  # epochs 1 and 2: all bad
        told = [str(w.message) for w in caught if "delivered no batch" in str(w.message)]
        assert len(told) == 2, told  # the next all-skipped epochs: once per loader, as before
        assert "epoch 0 delivered no batch after its resume" in told[0]
        assert told[1].startswith("headrace: epoch 1 delivered no batch: 8 sample(s) were skipped")
        assert "usually the dataset or a step" in told[1]
    finally:
        resumed.close()


class BigEndian(tud.Dataset):
    """``n`` float64 values from the index on, stored big-endian (as FITS files hold them),
    which ``torch.from_numpy`` refuses; ``flip``: reversed (negative strides, which the ring
    leaves to the transport)."""

    def __init__(self, n, flip=False):
        self.n = n
        self.flip = flip

    def __len__(self):
        return 4

    def __getitem__(self, i):
        a = np.arange(i, i + self.n, dtype=">f8")
        return a[::-1] if self.flip else a


def _arrays(batches):
    return [s for b in batches for s in (b if isinstance(b, list) else [b])]


@pytest.mark.parametrize("ctx, n, flip", [
    ("spawn", 600_000, False),  # 4.8 MB: over a quarter of spawn's 16 MiB ring
    ("fork", 200_000, True),  # 1.6 MB: over the inline limit, with strides the ring skips
])
def test_a_big_endian_array_that_misses_the_ring_arrives_as_torch_delivers_it(ctx, n, flip,
                                                                                no_leaks):
    # its shared copy went through torch.from_numpy, which refuses another byte order: the
    # worker died, the sample re-ran on the next one, which died alike (WorkerDiedError).
    # torch's workers pickle with protocol 4, which makes such arrays native (protocol 5,
    # Python 3.14's default, and num_workers=0 keep them as they are): the values are torch's,
    # the dtype the one __getitem__ returned
    ds = BigEndian(n, flip)
    kw = dict(num_workers=1, multiprocessing_context=ctx)
    want = _arrays(tud.DataLoader(ds, batch_size=None, collate_fn=ident_collate, **kw))
    for bs in (2, None):
        loader = hr.DataLoader(ds, batch_size=bs, collate_fn=ident_collate, **kw)
        try:
            got = _arrays(loader)
        finally:
            loader.close()
        assert len(got) == len(want) == 4
        for g, w, i in zip(got, want, range(4), strict=True):
            assert np.array_equal(g, w) and g.dtype == ds[i].dtype
    torch_it = iter(tud.DataLoader(ds, batch_size=2, **kw))
    with pytest.raises(ValueError):  # torch's default collate refuses them, in its worker
        list(torch_it)
    stop_torch_workers(torch_it)
    loader = hr.DataLoader(ds, batch_size=2, **kw)
    try:  # and so does headrace's, in the training process, not a worker's death
        with pytest.raises(hr.StepError) as info:
            list(loader)
        assert info.value.step == "collate_fn" and info.value.cause_type == "ValueError"
    finally:
        loader.close()


class OneUnsendable(tud.Dataset):
    """``(8 KB array of the index, worker pid)``; index 3: a ``Twice`` of two 4 MiB arrays,
    which the ring takes (all 16 MiB of a spawned worker's) before rebuilding it fails."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            return Twice((np.zeros(1 << 19), np.ones(1 << 19)))
        return np.full(1024, i), os.getpid()


def test_a_value_the_transport_cannot_encode_fails_its_sample_not_its_worker(no_leaks):
    # the encode's exception ended the worker: the sample re-ran on the next worker, which
    # ended alike, and the epoch raised WorkerDiedError blaming step 'load'. Then the ring
    # space its arrays took was never freed (its error carries no ring end): the next sample
    # waited for it forever (timeout= turns that into an error here)
    kw = dict(batch_size=None, num_workers=1, multiprocessing_context="spawn", timeout=60)
    loader = hr.DataLoader(OneUnsendable(), **kw)
    try:
        with pytest.raises(hr.StepError) as info:
            list(loader)
    finally:
        loader.close()
    assert info.value.index == 3 and info.value.step == "transport"
    assert info.value.cause_type == "TypeError" and "Twice.__new__()" in str(info.value)
    assert "could not be sent to the main process" in str(info.value)
    assert "Options(executor='threads')" in str(info.value)
    skip = hr.DataLoader(OneUnsendable(), **kw, options=hr.Options(on_error="skip"))
    try:  # nothing else lost, and one worker sent them all: it lived on
        got = list(skip)
        assert [int(a[0]) for a, _ in got] == [0, 1, 2, 4, 5]
        assert len({pid for _, pid in got}) == 1
        epoch = skip.stats().epochs[-1]
        assert epoch.skipped_samples == 1 and epoch.retried_samples == 0
    finally:
        skip.close()
    threads = hr.DataLoader(OneUnsendable(), batch_size=None, num_workers=1,
                            collate_fn=ident_collate, options=hr.Options(executor="threads"))
    try:  # the fix it names: nothing is sent, the sample arrives as it was made
        got = list(threads)
        assert type(got[3]) is Twice and len(got) == 6
    finally:
        threads.close()


class FullRingThenLock(tud.Dataset):
    """``(8 KB array of the index, worker pid)``; index 3: four 4 MiB arrays, which fill a
    spawned worker's 16 MiB ring, and a lock, which does not pickle."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        if i == 3:
            return [np.full(1 << 19, float(k)) for k in range(4)] + [threading.Lock()]
        return np.full(1024, i), os.getpid()


def test_a_sample_that_does_not_pickle_gives_its_ring_space_back(no_leaks):
    # its arrays were in the ring when pickling its message failed; the error sent instead
    # carries no ring end, so the training process never freed that space and the next
    # sample waited for it forever (timeout= turns that into an error here)
    loader = hr.DataLoader(FullRingThenLock(), batch_size=None, num_workers=1,
                           multiprocessing_context="spawn", timeout=60,
                           options=hr.Options(on_error="skip"))
    try:
        got = list(loader)
        assert [int(a[0]) for a, _ in got] == [0, 1, 2, 4, 5]
        assert len({pid for _, pid in got}) == 1
    finally:
        loader.close()


class Frames(tud.Dataset):
    """``[five 4 MiB arrays of i]``: more than a spawned worker's 16 MiB ring holds at once."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return [np.full(1 << 19, float(i)) for _ in range(5)]


def test_a_sample_larger_than_its_workers_ring_arrives(no_leaks):
    # each array fits the ring alone; the fifth found no room that only this sample's own
    # message could free, and the worker waited for ever (a review; torch delivers them)
    loader = hr.DataLoader(Frames(), batch_size=None, num_workers=1,
                           multiprocessing_context="spawn", timeout=120)
    try:
        got = [[float(a[0]) for a in s] + [sum(a.numel() for a in s)] for s in loader]
    finally:
        loader.close()
    assert got == [[float(i)] * 5 + [5 << 19] for i in range(3)]
