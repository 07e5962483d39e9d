"""IterableDataset as torch iterates it; errors in a sample, in collate_fn, in worker_init_fn."""

import pytest
import torch.utils.data as tud

from tests.conformance.conftest import flat, is_headrace
from tests.conformance.datasets import Failing, Shards, Squares, Unsharded

pytestmark = pytest.mark.integration

D1 = ("defect (findings D1, issue 12 item 7): with workers, an error in one sample ends "
      "headrace's epoch; torch raises for that batch and goes on")


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
def test_an_error_raises_for_its_batch_and_the_epoch_goes_on(Loader, workers, request,
                                                             no_leaks):
    if is_headrace(Loader) and workers:
        request.applymarker(pytest.mark.xfail(strict=True, reason=D1))
    got = drain(iter(Loader(Failing(12, {5}), batch_size=2, num_workers=workers)))
    assert got == [[0, 1], [2, 3], "ERR", [6, 7], [8, 9], [10, 11]]


def test_every_bad_batch_raises_once(Loader, request, no_leaks):
    """torch's test_error_workers: one error per batch, then StopIteration."""
    if is_headrace(Loader):
        request.applymarker(pytest.mark.xfail(strict=True, reason=D1))
    got = drain(iter(Loader(Failing(9, set(range(9))), batch_size=2, shuffle=True,
                            num_workers=2)))
    assert got == ["ERR"] * 5


def bad_collate(batch):
    if 9 in batch:
        raise KeyError("cannot collate 9")
    return tud.default_collate(batch)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_collate_fn_raises_for_its_batch(Loader, workers, request, no_leaks):
    if is_headrace(Loader) and workers:
        request.applymarker(pytest.mark.xfail(strict=True, reason=D1))
    it = iter(Loader(Squares(8), batch_size=2, num_workers=workers, collate_fn=bad_collate))
    assert drain(it) == [[0, 1], "ERR", [16, 25], [36, 49]]


def failing_init(worker_id):
    raise RuntimeError("Error in worker_init_fn")


def test_an_error_in_worker_init_fn_reaches_the_training_loop(Loader, no_leaks):
    loader = Loader(Squares(4), batch_size=2, num_workers=2, worker_init_fn=failing_init)
    with pytest.raises(RuntimeError, match="Error in worker_init_fn"):
        list(loader)
