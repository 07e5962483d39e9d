"""torch's iterator protocol: independent iterators, len(iter()), StopIteration, re-iteration."""

import pytest

from tests.conformance.conftest import flat, is_headrace
from tests.conformance.datasets import Squares

pytestmark = pytest.mark.integration

SQ = [i * i for i in range(12)]


@pytest.mark.parametrize("workers", [0, 2])
def test_each_iter_is_a_new_epoch_and_independent(Loader, workers, no_leaks):
    loader = Loader(Squares(12), batch_size=4, num_workers=workers)
    pairs = list(zip(loader, loader, strict=True))  # two iterators advanced in lockstep
    assert len(pairs) == 3
    assert [a.tolist() for a, _ in pairs] == [b.tolist() for _, b in pairs]
    first = iter(loader)
    head = next(first).tolist()
    assert flat(iter(loader)) == SQ  # a whole second epoch while the first is open
    assert head + flat(first) == SQ  # the first goes on where it was


@pytest.mark.parametrize("workers", [0, 2])
def test_iterator_has_len_and_is_its_own_iter(Loader, workers, no_leaks):
    loader = Loader(Squares(10), batch_size=3, num_workers=workers)
    it = iter(loader)
    assert len(it) == len(loader) == 4
    assert iter(it) is it
    assert len(list(it)) == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_exhausted_iterator_keeps_raising_stop_iteration(Loader, workers, no_leaks):
    it = iter(Loader(Squares(4), batch_size=2, num_workers=workers))
    assert len(list(it)) == 2
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(it)


@pytest.mark.parametrize("workers", [0, 2])
def test_reiteration_gives_whole_epochs(Loader, workers, no_leaks):
    loader = Loader(Squares(7), batch_size=2, num_workers=workers)
    for _ in range(3):
        assert flat(loader) == SQ[:7]


@pytest.mark.parametrize("workers", [0, 2])
def test_breaking_out_then_iterating_again(Loader, workers, no_leaks):
    loader = Loader(Squares(12), batch_size=2, num_workers=workers)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert flat(loader) == SQ


def test_len_follows_sampler_batch_size_and_drop_last(Loader):
    for kw, n in (({"batch_size": 5}, 3), ({"batch_size": 5, "drop_last": True}, 2),
                  ({"batch_size": None}, 12), ({"batch_size": 1}, 12),
                  ({"sampler": range(3), "batch_size": 2}, 2)):
        assert len(Loader(Squares(12), **kw)) == n


def test_len_follows_a_growing_dataset(Loader):
    data = [1, 2, 3, 4]
    loader = Loader(data, batch_size=3)
    data.append(5)
    assert len(loader) == 2


def test_a_new_persistent_iterator_takes_the_workers_over(Loader, no_leaks):
    loader = Loader(Squares(8), batch_size=2, num_workers=2, persistent_workers=True)
    old = iter(loader)
    next(old)
    new = iter(loader)
    if is_headrace(Loader):  # difference: REPLACED_ITERATOR
        assert new is not old
        with pytest.raises(RuntimeError, match="replaced by a newer iter"):
            next(old)
        assert flat(new) == SQ[:8]
        loader.close()
    else:  # torch resets the one shared iterator: `old` silently restarts the new epoch
        assert new is old
        assert flat(old) == SQ[:8]
        del old, new
        loader._iterator._shutdown_workers()
