"""Datasets for the conformance suite; module-level so that spawned workers can import them."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class Squares(Dataset):
    """``ds[i] == i * i`` as a Python int; ``len`` given."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i * i


class WhoRanMe(Dataset):
    """``(index, worker id, pid, torch.initial_seed(), info.seed, mark)`` where ``mark`` is what
    ``mark_worker`` set in this worker (``-1`` when it did not run)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int, int, int, int, int]:
        info = get_worker_info()
        wid = info.id if info is not None else -1
        seed = info.seed if info is not None else -1
        return i, wid, os.getpid(), torch.initial_seed(), seed, MARK.get("mark", -1)


MARK: dict[str, int] = {}
INIT_CHECKS: dict[str, Any] = {}


def mark_worker(worker_id: int) -> None:
    """A ``worker_init_fn`` that checks what torch documents about the moment it runs."""
    info = get_worker_info()
    assert info is not None and info.id == worker_id and worker_id < info.num_workers
    assert info.seed == torch.initial_seed(), "worker_init_fn sees torch seeded with info.seed"
    MARK["mark"] = 1000 + worker_id


def seed_in_init(worker_id: int) -> None:
    """The common pattern torch's own tests use: fix the seed in ``worker_init_fn``."""
    torch.manual_seed(12345)


class RandomDraw(Dataset):
    """``torch.rand(())`` drawn from the global generator inside ``__getitem__``."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> float:
        return float(torch.rand(()))


class Mutable(Dataset):
    """Returns ``self.version``: shows which copy of the dataset a worker holds."""

    def __init__(self) -> None:
        self.version = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return self.version


class Failing(Dataset):
    """Raises ``KeyError`` on the indices in ``bad``; else returns the index."""

    def __init__(self, n: int, bad: set[int]) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise KeyError(f"sample {i} is corrupt")
        return i


class Unprintable(KeyError):
    """A user's exception whose ``__str__`` itself raises (a typo in it)."""

    def __str__(self) -> str:
        return self.mesage  # type: ignore[attr-defined]


class FailingUnprintably(Failing):
    """``Failing``, raising :class:`Unprintable` (a ``KeyError``)."""

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise Unprintable(i)
        return i


class Counted(Dataset):
    """Counts the samples started, in a shared counter (``multiprocessing.Value``)."""

    def __init__(self, n: int, counter: Any) -> None:
        self.n = n
        self.counter = counter

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        with self.counter.get_lock():
            self.counter.value += 1
        return i


class Shards(IterableDataset):
    """An IterableDataset that splits ``range(n)`` between workers with ``get_worker_info()``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


class Unsharded(IterableDataset):
    """An IterableDataset that ignores workers: each worker yields all of it (as in torch)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


def where_collated(batch: list[Any]) -> tuple[bool, int, list[Any]]:
    """A ``collate_fn`` that reports whether it ran in a worker, and what it received."""
    return get_worker_info() is not None, os.getpid(), list(batch)


def receives(sample: Any) -> tuple[str, Any]:
    """A ``collate_fn`` for ``batch_size=None``: reports the type it received."""
    return type(sample).__name__, sample


class Gated(Dataset):
    """Sample ``gated`` waits until ``gate`` (an event of the fork context) opens: the training
    loop opens it, or the sample ``opener`` does when it is loaded (in whichever worker). A
    gated sample whose gate stayed shut for ``wait_s`` seconds comes out as ``-1``."""

    def __init__(self, n: int, gated: int, gate: Any, opener: int = -1,
                 wait_s: float = 30.0) -> None:
        self.n, self.gated, self.gate, self.opener, self.wait_s = n, gated, gate, opener, wait_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.opener:
            self.gate.set()
        if i == self.gated and not self.gate.wait(self.wait_s):
            return -1
        return i


class CountsStarts(WhoRanMe):
    """``WhoRanMe`` with a shared counter that ``count_start`` (a ``worker_init_fn``) bumps once
    per worker process started."""

    def __init__(self, n: int, counter: Any) -> None:
        super().__init__(n)
        self.counter = counter


def count_start(worker_id: int) -> None:
    info = get_worker_info()
    assert info is not None
    with info.dataset.counter.get_lock():
        info.dataset.counter.value += 1
