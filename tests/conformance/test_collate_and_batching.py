"""collate_fn (what it receives, where it runs), batch_size=None, drop_last, samplers,
batch samplers (pin_memory: test_pin_memory.py)."""

import os
import re
import threading
import time
from collections import namedtuple

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from tests.conformance.conftest import COLLATE_IN_MAIN, SAMPLE_AWARE, flat, is_headrace
from tests.conformance.datasets import Squares, receives, where_collated

pytestmark = pytest.mark.integration

SQ = [i * i for i in range(20)]
Point = namedtuple("Point", ["x", "y"])


class Structured(tud.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"t": torch.full((2,), float(i)), "a": np.arange(3) + i, "n": i, "f": i / 2,
                "s": f"s{i}", "p": Point(i, torch.tensor(i)), "l": [i, -i]}


class OddSamples(tud.Dataset):
    """Four samples default_collate refuses: all alike (``"none"``, ``"set"``), or the last one
    of another shape (``"shape"``) or with a leaf of another type (``"leaf"``)."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if self.kind == "none":
            return None
        if self.kind == "set":
            return {i}
        if self.kind == "shape":
            return torch.zeros(2 if i < 3 else 3)
        return {"t": torch.zeros(2), "y": i if i < 3 else None}


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind, error, words, differs", [
    ("none", TypeError, "found <class 'NoneType'>", None),
    ("set", TypeError, "found <class 'set'>", None),
    ("shape", RuntimeError, "stack expects each tensor to be equal size",
     "sample index 3 has shape (3,) where sample index 0 has (2,)"),
    ("leaf", RuntimeError, "Could not infer dtype of NoneType",
     "sample index 3 has type NoneType at ['y'] where sample index 0 has int"),
])
def test_a_collation_error_is_torchs_and_names_the_sample_that_differs(
        Loader, workers, kind, error, words, differs, no_leaks):
    """torch's error type and words; headrace adds the batch's sample indices and, only when
    one sample differs from the first in type or shape, which and how (it said "a sample of
    another shape or type than the others is the usual cause" of every collation error,
    samples all alike included: a bug hunt's find)."""
    it = iter(Loader(OddSamples(kind), batch_size=4, num_workers=workers, in_order=True))
    with pytest.raises(error, match=re.escape(words)) as caught:
        next(it)
    with pytest.raises(StopIteration):  # the epoch's end: torch's workers stop now, not at GC
        next(it)
    if is_headrace(Loader):
        first_line = str(caught.value).split("\n")[0]
        hint = f"; {differs}" if differs else ""
        assert first_line.endswith(f"(batch of sample indices [0, 1, 2, 3]{hint})")


@pytest.mark.parametrize("workers", [0, 2])
def test_collate_fn_receives_the_list_of_a_batchs_samples(Loader, workers, no_leaks):
    got = list(Loader(Squares(7), batch_size=3, num_workers=workers, collate_fn=where_collated))
    assert [b[2] for b in got] == [[0, 1, 4], [9, 16, 25], [36]]


def test_where_collate_fn_runs(Loader, no_leaks):
    got = list(Loader(Squares(6), batch_size=3, num_workers=2, collate_fn=where_collated))
    in_worker = {b[0] for b in got}
    pids = {b[1] for b in got}
    if is_headrace(Loader):  # difference: COLLATE_IN_MAIN (batch composition is known there)
        assert in_worker == {False} and pids == {os.getpid()}, COLLATE_IN_MAIN
    else:
        assert in_worker == {True} and os.getpid() not in pids


@pytest.mark.parametrize("workers", [0, 2])
def test_without_auto_collation_collate_fn_gets_single_samples(Loader, workers, no_leaks):
    got = list(Loader(Squares(3), batch_size=None, num_workers=workers, collate_fn=receives))
    assert got == [("int", 0), ("int", 1), ("int", 4)]


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_size_none_converts_but_does_not_collate(Loader, workers, no_leaks):
    got = list(Loader(Structured(), batch_size=None, num_workers=workers))
    assert len(got) == 6
    assert isinstance(got[1]["n"], int) and got[1]["s"] == "s1"
    assert isinstance(got[1]["a"], torch.Tensor) and got[1]["a"].tolist() == [1, 2, 3]
    assert type(got[1]["p"]) is Point


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_result_is_torchs(Loader, workers, no_leaks):
    ref = list(tud.DataLoader(Structured(), batch_size=4))
    got = list(Loader(Structured(), batch_size=4, num_workers=workers))
    assert len(got) == len(ref) == 2
    for a, b in zip(got, ref, strict=True):
        assert a.keys() == b.keys()
        for k in ("t", "a", "n", "f"):
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
        assert a["s"] == b["s"]
        assert type(a["p"]) is Point and torch.equal(a["p"].y, b["p"].y)
        assert type(a["l"]) is list and all(torch.equal(x, y) for x, y in zip(a["l"], b["l"], strict=True))


@pytest.mark.parametrize("workers", [0, 2])
def test_drop_last(Loader, workers, no_leaks):
    loader = Loader(Squares(11), batch_size=4, drop_last=True, num_workers=workers)
    got = [b.tolist() for b in loader]
    assert len(loader) == 2 and got == [SQ[0:4], SQ[4:8]]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterable_of_indices_as_sampler(Loader, workers, no_leaks):
    loader = Loader(Squares(20), sampler=range(19, 1, -2), batch_size=3, num_workers=workers)
    assert flat(loader) == [SQ[i] for i in range(19, 1, -2)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_sampler_keeps_its_batches(Loader, workers, no_leaks):
    batches = [[3, 1], [0], [5, 6, 7], [2, 2]]  # a repeated index, uneven sizes
    got = [b.tolist() for b in Loader(Squares(8), batch_sampler=batches, num_workers=workers)]
    assert got == [[SQ[i] for i in b] for b in batches]


class Shards(tud.BatchSampler):
    """A ``BatchSampler`` subclass with no ``sampler`` attribute (Accelerate's
    ``BatchSamplerShard`` is one): its batches are its own."""

    def __init__(self, batches: list) -> None:  # no super(): nothing to wrap
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_sampler_subclass_without_a_sampler_keeps_its_batches(Loader, workers, no_leaks):
    # headrace read batch_sampler.sampler to tell a random order and a shuffle setting: an
    # AttributeError at iter(), state_dict() and explain(), where torch iterates
    batches = [[0, 1], [2, 3], [4, 5], [6, 7]]
    loader = Loader(Squares(8), batch_sampler=Shards(batches), num_workers=workers)
    assert [b.tolist() for b in loader] == [[SQ[i] for i in b] for b in batches]
    if is_headrace(Loader):
        assert loader.state_dict()["shuffle"] is None  # not known: not compared on resume
        assert loader.explain()  # it raised AttributeError


@pytest.mark.parametrize("workers", [0, 2])
def test_an_empty_batch_from_a_batch_sampler_is_collated_in_its_turn(Loader, workers, no_leaks):
    # torch calls collate_fn([]) for it (a bucketing sampler's empty bucket): a custom collate_fn
    # gives its batch, the default one raises IndexError for that batch and the epoch goes on
    ordered = {"in_order": True} if is_headrace(Loader) else {}
    batches = [[3, 1], [], [5, 6, 7], [], [2]]
    got = list(Loader(Squares(8), batch_sampler=batches, num_workers=workers, collate_fn=list,
                      **ordered))
    assert got == [[SQ[i] for i in b] for b in batches]
    it = iter(Loader(Squares(8), batch_sampler=[[3], [], [5]], num_workers=workers, **ordered))
    assert next(it).tolist() == [SQ[3]]
    with pytest.raises(IndexError):
        next(it)
    assert next(it).tolist() == [SQ[5]]
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("workers", [0, 2])
def test_sampler_with_replacement_delivers_every_position(Loader, workers, no_leaks):
    sampler = tud.RandomSampler(range(6), replacement=True, num_samples=30,
                                generator=torch.Generator().manual_seed(5))
    expected = [SQ[i] for i in tud.RandomSampler(range(6), replacement=True, num_samples=30,
                                                 generator=torch.Generator().manual_seed(5))]
    got = flat(Loader(Squares(6), sampler=sampler, batch_size=4, num_workers=workers))
    assert sorted(got) == sorted(expected)  # duplicates included


def test_shuffle_with_a_generator_draws_torchs_order(Loader, no_leaks):
    def run(cls, **kw):
        return [b.tolist() for b in cls(Squares(20), batch_size=4, shuffle=True, num_workers=2,
                                        generator=torch.Generator().manual_seed(11), **kw)]

    ref = run(tud.DataLoader)
    got = run(Loader)
    assert sorted(flat(got)) == sorted(flat(ref)) == sorted(SQ)
    if is_headrace(Loader):  # difference: SAMPLE_AWARE: same samples, grouping may differ
        assert run(Loader, in_order=True) == ref, SAMPLE_AWARE
    else:
        assert got == ref


@pytest.mark.parametrize("shuffle", [False, True])
def test_distributed_sampler_shares_are_disjoint(Loader, shuffle, no_leaks):
    from torch.utils.data.distributed import DistributedSampler

    seen = []
    for rank in range(3):
        s = DistributedSampler(range(20), num_replicas=3, rank=rank, shuffle=shuffle, seed=2)
        got = flat(Loader(Squares(20), sampler=s, batch_size=3, num_workers=2))
        assert len(got) == len(s)
        if not shuffle:
            assert got == [SQ[i] for i in s]
        seen += got
    assert sorted(set(seen)) == sorted(SQ)


class _Reentry:
    """A collate_fn that records how many of its calls overlapped (a collator reusing one
    buffer, or a tokenizer refusing concurrent calls, breaks when they do)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.inside = self.most = 0

    def __call__(self, batch):
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(0.002)  # simulated work (a collator's): concurrent calls would overlap
            return [int(x) for x in batch]
        finally:
            with self.lock:
                self.inside -= 1


@pytest.mark.parametrize("workers", [0, 2])
def test_collate_fn_is_never_called_concurrently(Loader, workers, no_leaks):
    collate = _Reentry()
    got = list(Loader(Squares(40), batch_size=2, num_workers=workers, collate_fn=collate))
    assert sorted(x for b in got for x in b) == sorted(SQ + [i * i for i in range(20, 40)])
    # once at a time, as torch calls it in each process; torch's workers call their own copy
    # (COLLATE_IN_MAIN), headrace calls this one
    assert collate.most == (0 if workers and not is_headrace(Loader) else 1)

