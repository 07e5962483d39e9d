"""IterableDataset as torch iterates it; errors in a sample, in collate_fn, in worker_init_fn."""

import pytest
import torch.utils.data as tud

from tests.conformance.conftest import SAMPLE_AWARE, flat, is_headrace
from tests.conformance.datasets import (
    Failing,
    FailingUnprintably,
    Shards,
    Squares,
    Unprintable,
    Unsharded,
)
from tests.helpers import stop_torch_workers

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_sharded_with_worker_info(Loader, workers, no_leaks):
    got = flat(Loader(Shards(20), batch_size=3, num_workers=workers))
    assert sorted(got) == list(range(20))


def test_iterable_in_order_interleaves_workers_like_torch(Loader, no_leaks):
    ref = [b.tolist() for b in tud.DataLoader(Shards(12), batch_size=2, num_workers=2)]
    got = [b.tolist() for b in Loader(Shards(12), batch_size=2, num_workers=2)]
    assert got == ref


def test_iterable_without_sharding_is_duplicated_per_worker(Loader, no_leaks):
    got = flat(Loader(Unsharded(5), batch_size=2, num_workers=2))
    assert sorted(got) == sorted(list(range(5)) * 2)


def test_iterable_batch_size_none_keeps_python_ints(Loader, no_leaks):
    got = list(Loader(Unsharded(4), batch_size=None))
    assert got == [0, 1, 2, 3] and all(type(x) is int for x in got)


def test_iterable_warns_past_its_len(Loader, no_leaks):
    loader = Loader(Unsharded(4), batch_size=None, num_workers=2)
    assert len(loader) == 4
    with pytest.warns(UserWarning, match="samples have been fetched"):
        assert len(list(loader)) == 8


def test_iterable_rejects_shuffle_and_samplers(Loader):
    for kw in ({"shuffle": True}, {"sampler": [0]}, {"batch_sampler": [[0]]}):
        with pytest.raises(ValueError, match="DataLoader with IterableDataset"):
            Loader(Shards(4), **kw)


def drain(it):
    """Every batch until StopIteration; an error counts as 'ERR' and the loop goes on."""
    out = []
    for _ in range(100):  # bounded: a loader that raised forever would fail, not hang
        try:
            out.append(next(it).tolist())
        except StopIteration:
            return out
        except KeyError:
            out.append("ERR")
    raise AssertionError(f"no StopIteration after 100 next(): {out[:8]}...")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_raises_for_its_batch_and_the_epoch_goes_on(Loader, workers, no_leaks):
    got = drain(iter(Loader(Failing(12, {5}), batch_size=2, num_workers=workers)))
    assert got == [[0, 1], [2, 3], "ERR", [6, 7], [8, 9], [10, 11]]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_whose_message_cannot_be_formatted_raises_for_its_batch(Loader, workers,
                                                                         no_leaks):
    # formatting its message raised inside headrace: with num_workers=0 every later next()
    # raised that AttributeError, naming no sample; a worker died of it (WorkerDiedError)
    it = iter(Loader(FailingUnprintably(12, {5}), batch_size=2, num_workers=workers))
    assert drain(it) == [[0, 1], [2, 3], "ERR", [6, 7], [8, 9], [10, 11]]
    if is_headrace(Loader):
        with pytest.raises(Unprintable) as caught:
            list(Loader(FailingUnprintably(4, {1}), batch_size=2, num_workers=workers))
        assert caught.value.index == 1 and "could not be formatted" in caught.value.args[0]


def test_when_every_sample_fails(Loader, no_leaks):
    """torch's test_error_workers: with torch, one error per batch, then StopIteration."""
    def errors(**kw):
        return drain(iter(Loader(Failing(9, set(range(9))), batch_size=2, shuffle=True,
                                 num_workers=2, **kw)))

    if is_headrace(Loader):  # difference: SAMPLE_AWARE: a failed sample belongs to no batch
        assert errors() == ["ERR"] * 9, SAMPLE_AWARE  # one error per failing sample
        assert errors(in_order=True) == ["ERR"] * 5  # torch's batches: one per batch
    else:
        assert errors() == ["ERR"] * 5


def test_one_bad_sample_in_a_random_order(Loader, no_leaks):
    """torch drops the bad sample's whole batch; sample-aware batching loses only the sample."""
    got = drain(iter(Loader(Failing(12, {5}), batch_size=2, shuffle=True, num_workers=2)))
    assert got.count("ERR") == 1
    good = sorted(i for b in got if b != "ERR" for i in b)
    if is_headrace(Loader):  # difference: SAMPLE_AWARE
        assert good == [i for i in range(12) if i != 5], SAMPLE_AWARE
    else:
        assert len(good) == 10 and 5 not in good  # its batch-mate went with it


def bad_collate(batch):
    if 9 in batch:
        raise KeyError("cannot collate 9")
    return tud.default_collate(batch)


def unprintable_collate(batch):
    if 9 in batch:
        raise Unprintable(9)
    return tud.default_collate(batch)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_error_whose_message_cannot_be_formatted_raises_for_its_batch(
        Loader, workers, no_leaks):
    # formatting it raised an AttributeError naming no batch, at every later next() with workers
    it = iter(Loader(Squares(8), batch_size=2, num_workers=workers, collate_fn=unprintable_collate))
    assert drain(it) == [[0, 1], "ERR", [16, 25], [36, 49]]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_collate_fn_raises_for_its_batch(Loader, workers, no_leaks):
    it = iter(Loader(Squares(8), batch_size=2, num_workers=workers, collate_fn=bad_collate))
    assert drain(it) == [[0, 1], "ERR", [16, 25], [36, 49]]


def failing_init(worker_id):
    raise RuntimeError("Error in worker_init_fn")


def test_an_error_in_worker_init_fn_reaches_the_training_loop(Loader, no_leaks):
    loader = Loader(Squares(4), batch_size=2, num_workers=2, worker_init_fn=failing_init)
    it = iter(loader)
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        list(it)
    if not is_headrace(Loader):
        stop_torch_workers(it)
