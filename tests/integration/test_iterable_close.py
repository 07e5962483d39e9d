"""``loader.close()`` over an IterableDataset (torch's own iterator, ``runtime/iterable_dataset.py``)
stops it as it stops a map-style epoch: its worker processes (persistent ones too) are gone when
close() returns, and a later ``next()`` raises ``LoaderClosedError`` part-way through the epoch,
``StopIteration`` after its end; a new ``iter(loader)`` starts the dataset over."""

from __future__ import annotations

import multiprocessing
import time

import psutil
import pytest
import torch.utils.data as tud

import headrace as hr
from tests.helpers import close_while_next_waits

pytestmark = pytest.mark.integration


class Stream(tud.IterableDataset):
    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 40, step))


def children() -> set[int]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:  # exited while listed
            pass
    return out


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_close_part_way_stops_the_workers_and_the_next_next_raises(workers, persistent,
                                                                     no_leaks):
    before = children()
    loader = hr.DataLoader(Stream(), batch_size=4, num_workers=workers,
                           persistent_workers=persistent)
    it = iter(loader)
    next(it)
    assert len(children() - before) == workers
    assert loader.stats().workers == workers  # torch's iterator's processes, as counted
    loader.close()
    assert children() - before == set()  # while the loader and its iterator are still held
    assert loader.stats().workers == 0
    for _ in range(2):  # that and every later next()
        with pytest.raises(hr.LoaderClosedError, match="1 batch.*delivered"):
            next(it)
    assert sum(len(b) for b in loader) == 40  # a new iter(): the dataset from its start
    loader.close()


def test_close_after_the_epochs_end_stops_persistent_workers_and_leaves_stop_iteration(no_leaks):
    # (without persistent workers torch's iterator stops them itself at the epoch's end)
    before = children()
    loader = hr.DataLoader(Stream(), batch_size=4, num_workers=2, persistent_workers=True)
    it = iter(loader)
    assert sum(len(b) for b in it) == 40
    loader.close()
    assert children() - before == set()
    with pytest.raises(StopIteration):
        next(it)


class SlowStream(tud.IterableDataset):
    """Items that take work; ``under_way`` is set once a worker is past its first items."""

    def __init__(self) -> None:
        self.under_way = multiprocessing.get_context("fork").Event()

    def __iter__(self):
        for i in range(1000):
            if i == 4:
                self.under_way.set()
            time.sleep(0.05)  # simulated work: the training thread waits for each batch
            yield i


@pytest.mark.parametrize("persistent", [False, True])
def test_close_from_another_thread_while_next_waits_raises_loader_closed(persistent, no_leaks):
    # torch's queues went away under the waiting next(): FileNotFoundError or
    # ConnectionResetError, naming no place; and a state_dict() taken after the part-way
    # close() said nothing was delivered (no IterablePositionWarning on its load)
    data = SlowStream()
    loader = hr.DataLoader(data, batch_size=2, num_workers=2, persistent_workers=persistent)
    it = iter(loader)
    next(it)
    with pytest.raises(hr.LoaderClosedError):
        close_while_next_waits(loader, it, data.under_way, 1000)  # bounded: the stream's length
    assert loader.state_dict()["batches_delivered"] >= 1
