"""timeout, prefetch_factor, persistent_workers, pickling and copying, frozen attributes,
DataLoader[T], argument validation."""

import copy
import multiprocessing
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from tests.conformance.conftest import flat, is_headrace
from tests.conformance.datasets import Counted, CountsStarts, Mutable, Squares, count_start
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration

SQ = [i * i for i in range(20)]


def test_timeout_raises_when_a_batch_is_late(Loader, no_leaks):
    loader = Loader(IndexDataset(4, slow_every=4, slow_s=3.0), batch_size=2, num_workers=1,
                    timeout=1)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after \d+ seconds"):
        next(iter(loader))


class LateSample(Dataset):
    """``n`` samples; sample 2 waits for ``gate`` (a process-shared event; 60 s at most; None:
    not at all), the others not."""

    def __init__(self, gate, n: int = 8) -> None:
        self.gate = gate
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == 2 and self.gate is not None:
            self.gate.wait(60)
        return i


def test_a_timeout_leaves_the_epoch_going(Loader, no_leaks):
    # torch's iterator goes on after its timeout error; headrace's closed the epoch, and the
    # next next() ended it (StopIteration): a loop that retried lost the rest without a word
    gate = multiprocessing.get_context("fork").Event()
    it = iter(Loader(LateSample(gate), batch_size=2, num_workers=1, timeout=0.5))
    try:
        assert next(it).tolist() == [0, 1]
        with pytest.raises(RuntimeError, match="timed out"):
            next(it)  # sample 2 holds its batch
        gate.set()  # it comes now: the same iterator goes on
        assert [b.tolist() for b in it] == [[2, 3], [4, 5], [6, 7]]
    finally:
        gate.set()


class LateCollate:
    """A collate_fn whose batch holding sample 10 waits for ``gate`` (a process-shared event;
    60 s at most): a tokenizer server, a lock, a fetch that hangs."""

    def __init__(self, gate) -> None:
        self.gate = gate

    def __call__(self, batch):
        if 10 in batch:
            self.gate.wait(60)
        return torch.tensor(batch)


def test_a_timeout_bounds_a_collate_fn_that_hangs(Loader, no_leaks):
    # torch's workers collate, so its timeout bounds a collate_fn too; headrace collates in the
    # training process, and next() waited for the collate thread unbounded (30 s in a hunt)
    # (past the first four batches, where headrace runs a collate_fn inside next() while it
    # watches it for random draws: README)
    gate = multiprocessing.get_context("fork").Event()
    it = iter(Loader(LateSample(None, 14), batch_size=2, num_workers=1, timeout=0.5,
                     collate_fn=LateCollate(gate)))
    try:
        assert [next(it).tolist() for _ in range(5)] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
        with pytest.raises(RuntimeError, match="timed out"):
            next(it)  # [10, 11]'s collate_fn waits
        gate.set()  # it returns now: the same iterator goes on, that batch first
        assert [b.tolist() for b in it] == [[10, 11], [12, 13]]
    finally:
        gate.set()


def test_timeout_without_workers(Loader, no_leaks):
    loader = Loader(Squares(4), batch_size=2, timeout=5)  # both build it
    if is_headrace(Loader):  # difference: TIMEOUT_WITHOUT_WORKERS
        with pytest.warns(UserWarning, match=r"timeout=5 has no effect with num_workers=0"):
            it = iter(loader)
        assert flat(it) == SQ[:4]
    else:
        with pytest.raises(AssertionError, match="requires timeout == 0"):
            iter(loader)


def test_timeout_is_validated(Loader):
    with pytest.raises(ValueError, match="timeout option should be non-negative"):
        Loader(Squares(4), timeout=-1)


def test_prefetch_factor_needs_workers_and_defaults_to_two(Loader):
    with pytest.raises(ValueError, match="prefetch_factor"):
        Loader(Squares(4), prefetch_factor=2)
    assert Loader(Squares(4), num_workers=2).prefetch_factor == 2
    assert Loader(Squares(4)).prefetch_factor is None


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetch_factor_bounds_the_samples_ahead(Loader, prefetch, no_leaks):
    """At any time, samples started <= (batches taken + prefetch_factor x workers) x batch.

    Difference (headrace): the samples ahead are never fewer than two batches plus one sample
    per worker (``runtime/work.py`` ``default_max_in_flight``), so that a batch can fill while
    one is out; with ``prefetch_factor=1`` that is more than torch's bound."""
    from headrace.runtime.work import default_max_in_flight

    counter = multiprocessing.get_context("fork").Value("i", 0)
    bs, workers = 2, 2
    ahead = prefetch * workers * bs
    if is_headrace(Loader):
        ahead = default_max_in_flight(bs, workers, prefetch)
    loader = Loader(Counted(40, counter), batch_size=bs, num_workers=workers,
                    prefetch_factor=prefetch)
    taken = 0
    for batch in loader:
        taken += 1
        with counter.get_lock():
            started = counter.value
        assert started <= taken * bs + ahead
        assert len(batch) == bs
    assert taken == 20 and counter.value == 40


def test_persistent_workers_need_workers(Loader):
    with pytest.raises(ValueError, match="persistent_workers option needs num_workers > 0"):
        Loader(Squares(4), persistent_workers=True)


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_processes_across_epochs(Loader, persistent, no_leaks):
    started = multiprocessing.get_context("fork").Value("i", 0)
    loader = Loader(CountsStarts(8, started), batch_size=None, num_workers=2,
                    persistent_workers=persistent, worker_init_fn=count_start)
    try:
        pids = [{r[2] for r in loader} for _ in range(2)]
        expected = 2 if persistent else 4  # worker starts over two epochs
        if is_headrace(type(loader)):
            # headrace sends samples to the workers that are ready: on a loaded machine a
            # worker still forking may get none before the epoch ends (and a non-persistent
            # one is then stopped before its worker_init_fn ran). Never more starts than torch.
            assert len(pids[0]) <= started.value <= expected
        else:
            assert started.value == expected
        if persistent:
            assert len(pids[0] | pids[1]) <= 2  # the same processes served both epochs
        else:
            assert not pids[0] & pids[1]
    finally:
        _shut(loader)


def _shut(loader):
    """Stop persistent workers now (torch's through its iterator, headrace's with close())."""
    if is_headrace(type(loader)):
        loader.close()
    elif loader._iterator is not None:
        loader._iterator._shutdown_workers()


def test_persistent_workers_keep_their_dataset_copy(Loader, no_leaks):
    """torch's test_dataset_not_reset: workers hold the dataset as it was when they started."""
    ds = Mutable()
    loader = Loader(ds, batch_size=4, num_workers=2, persistent_workers=True)
    assert flat(loader) == [0] * 8
    try:
        ds.version = 1
        assert flat(loader) == [0] * 8
    finally:
        _shut(loader)


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_pickles_and_copies(Loader, how, workers, no_leaks):
    loader = Loader(Squares(9), batch_size=4, num_workers=workers)
    assert flat(loader) == SQ[:9]  # after an epoch, too
    clone = pickle.loads(pickle.dumps(loader)) if how == "pickle" else copy.deepcopy(loader)
    assert type(clone) is type(loader)
    assert clone.batch_size == 4 and clone.num_workers == workers
    assert flat(clone) == SQ[:9]


@pytest.mark.parametrize("attr", ["batch_size", "batch_sampler", "sampler", "drop_last",
                                  "dataset", "persistent_workers"])
def test_frozen_attributes_raise(Loader, attr):
    loader = Loader(Squares(8), batch_size=2)
    with pytest.raises(ValueError, match=f"{attr} attribute should not be set"):
        setattr(loader, attr, None)


def test_the_class_is_generic(Loader):
    alias = Loader[list[torch.Tensor]]
    assert alias.__origin__ is Loader


@pytest.mark.parametrize("kw, error", [
    ({"num_workers": -1}, ValueError),
    ({"batch_size": None, "drop_last": True}, ValueError),
    ({"sampler": [0, 1], "shuffle": True}, ValueError),
    ({"batch_sampler": [[0]], "batch_size": 2}, ValueError),
    ({"num_workers": 0, "multiprocessing_context": "spawn"}, ValueError),
    ({"num_workers": 1, "multiprocessing_context": "bad"}, ValueError),
    ({"num_workers": 1, "multiprocessing_context": object()}, TypeError),
    ({"num_workers": "2"}, TypeError),  # torch: '<' not supported between 'str' and 'int'
    ({"num_workers": "Auto"}, TypeError),  # (headrace's ValueError, a bug hunt's find)
])
def test_invalid_arguments_raise_torchs_errors(Loader, kw, error):
    with pytest.raises(error):
        Loader(Squares(4), **kw)



def test_a_string_other_than_auto_is_a_type_error_that_says_what_num_workers_takes(Loader):
    with pytest.raises(TypeError) as info:
        Loader(Squares(4), batch_size=2, num_workers="2")
    if is_headrace(Loader):
        assert "num_workers must be an int or 'auto'" in str(info.value)
        assert "'2'" in str(info.value)


NOT_AN_INTEGER = "'float' object cannot be interpreted as an integer"


def test_arguments_of_the_wrong_type_raise_a_type_error(Loader, no_leaks):
    """Both raise TypeError, torch in iter() (its ``range()`` over the counts, its
    ``random_(generator=...)``), headrace when the loader is built: ARGUMENT_TYPES_AT_BUILD.
    headrace failed in iter() in words about sequences (num_workers=1.5), read ahead by 2.5
    batches (prefetch_factor=2.5) and raised an AttributeError about ``get_state``
    (generator=3), a bug hunt's find. What torch's ``range()`` takes is kept: NumPy's
    integers, bools."""
    for kw, words in [({"num_workers": 1.5}, NOT_AN_INTEGER),
                      ({"num_workers": 2, "prefetch_factor": 2.5}, NOT_AN_INTEGER),
                      ({"num_workers": 2, "prefetch_factor": 2.0}, NOT_AN_INTEGER),
                      ({"generator": 3}, "generator"),
                      ({"generator": 3, "shuffle": True}, "generator")]:
        if is_headrace(Loader):  # difference: ARGUMENT_TYPES_AT_BUILD
            with pytest.raises(TypeError, match=words):
                Loader(Squares(4), batch_size=2, **kw)
        else:
            loader = Loader(Squares(4), batch_size=2, **kw)
            with pytest.raises(TypeError, match=words):
                iter(loader)
    loader = Loader(Squares(4), batch_size=2, num_workers=np.int64(1),
                    prefetch_factor=np.int32(1), generator=torch.Generator())
    assert flat(loader) == SQ[:4]
    assert flat(Loader(Squares(4), batch_size=2, num_workers=True, prefetch_factor=True)) == SQ[:4]


@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
def test_multiprocessing_context(Loader, ctx, no_leaks):
    loader = Loader(Squares(9), batch_size=4, num_workers=1, multiprocessing_context=ctx)
    assert [b.tolist() for b in loader] == [SQ[0:4], SQ[4:8], SQ[8:9]]


def test_num_workers_set_after_construction_takes_what_init_takes(Loader, no_leaks):
    """torch honours ``loader.num_workers = n`` set after construction; headrace normalised
    only ``__init__``'s value, so NumPy's ``int64(2)`` failed in iter() ("object of type
    'numpy.int64' has no len()"), ``"auto"`` in words about concatenating strings and ``-1``
    in words about arrays (a bug hunt's finds). headrace raises torch's constructor error for
    ``-1`` at the assignment (torch asserts at iter(), naming num_workers too), and takes
    ``"auto"`` where the loader was built with it."""
    loader = Loader(Squares(6), batch_size=2, num_workers=1)  # (torch's 0 -> 2 fails)
    loader.num_workers = np.int64(2)
    assert flat(loader) == SQ[:6]
    if not is_headrace(Loader):  # (its -1 asserts in iter() and warns again in __del__)
        return
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        loader.num_workers = -1
    with pytest.raises(TypeError, match="num_workers must be an int or 'auto'"):
        loader.num_workers = "2"
    with pytest.raises(ValueError, match="needs a loader built with num_workers='auto'"):
        loader.num_workers = "auto"  # (its monitor has no scaler)
    auto = Loader(Squares(6), batch_size=2, num_workers="auto")
    auto.num_workers = 1
    auto.num_workers = "auto"
    assert auto.autoscale and auto.num_workers >= 1
    assert sorted(flat(auto)) == SQ[:6]
