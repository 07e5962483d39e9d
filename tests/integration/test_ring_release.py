"""A worker's ring (runtime/ring.py) is unmapped in the training process when the worker is
disposed of, not when the last reference to its handle goes: an iterator kept after its epoch
kept every worker's resident ring pages."""

import gc

import pytest

from headrace.bench.ring_memory import _Samples, ring_pages
from headrace.runtime import DataLoader

pytestmark = pytest.mark.integration


@pytest.fixture
def no_gc():
    """Nothing collected behind the test's back: what it sees unmapped was unmapped at once."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _own_rings(before: tuple[int, int, int]) -> int:
    return ring_pages()[0] - before[0]


def test_an_ended_epoch_unmaps_its_workers_rings_while_its_iterator_is_kept(no_leaks, no_gc):
    before = ring_pages()
    loader = DataLoader(_Samples(200, 64 * 256), batch_size=8, num_workers=2)
    it = iter(loader)
    assert sum(len(b) for b in it) == 200
    assert _own_rings(before) == 0, "the epoch's workers stopped but their rings are mapped"
    del it


def test_persistent_workers_keep_their_rings_until_the_loader_closes(no_leaks, no_gc):
    before = ring_pages()
    loader = DataLoader(_Samples(200, 64 * 256), batch_size=8, num_workers=2,
                        persistent_workers=True)
    for _ in range(2):
        it = iter(loader)
        assert sum(len(b) for b in it) == 200
        assert _own_rings(before) == 2  # the workers (and their rings) serve the next epoch
    loader.close()
    assert _own_rings(before) == 0
    del it
