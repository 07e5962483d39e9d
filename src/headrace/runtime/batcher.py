"""Batch formation: which batch, and which row of it, each finished sample goes to.

Pure bookkeeping over epoch positions (no threads, no processes, no sample data): the scheduler
asks :meth:`Batcher.place` where a finished sample belongs *when it arrives*, so that its arrays
can be copied once, straight into that row of the batch (``runtime/assembly.py``).

Three ways to group, chosen by the loader:

* ``regroup`` (default, sample-aware): the next ``batch_size`` samples to finish form the next
  batch, in the order they finish, whichever lane they came through (MinatoLoader Algorithm 1,
  lines 20-30, fills a batch from its fast queue first, then its slow queue; as both queues hold
  only finished samples and a batch goes out as soon as it is full, that preference only orders
  rows within a batch, so it is dropped). Used with torch's default BatchSampler, whose grouping
  carries no meaning beyond its size.
* ``ordered`` (``in_order=True``): the sampler's batches, in the sampler's order: torch's order
  and batches exactly.
* ``grouped``: the sampler's batches kept whole but yielded as soon as complete. Used with a
  user-given ``batch_sampler`` (its grouping may mean something, e.g. length buckets) and with
  ``batch_size=None``.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Literal, NamedTuple

Mode = Literal["regroup", "ordered", "grouped"]


class Place(NamedTuple):
    """Where a finished sample goes: batch ``key``, row ``row`` of a batch of ``capacity`` rows."""

    key: int
    row: int
    capacity: int


class Ready(NamedTuple):
    """A batch ready to go out: its ``key``, the rows filled (ascending; a skipped sample
    leaves a hole) and the epoch positions of those rows, in the same order. ``drop``: a short
    last batch that ``drop_last`` forbids (its samples are not yielded). ``empty``: a user
    ``batch_sampler`` yielded an empty list here."""

    key: int
    rows: list[int]
    positions: list[int]
    drop: bool = False
    empty: bool = False  # a sampler batch of no index: collate_fn([]) is its batch, as in torch


class Batcher:
    def __init__(self, mode: Mode, batch_size: int | None, drop_last: bool = False,
                 first_key: int = 0) -> None:
        """``first_key``: regroup's first batch key (batches are numbered from it; a resumed
        epoch starts past the batches it delivered, whose keys seeded a collate_fn's draws)."""
        if mode == "regroup" and not batch_size:
            raise ValueError("regroup needs a batch size")
        self.mode = mode
        self.batch_size = batch_size or 1
        # regroup: a short last batch is dropped, as torch promises: every batch is batch_size
        # long (short only because samples were skipped or failed: EpochStats.dropped_samples)
        self.drop_last = drop_last
        # regroup: the batch being filled
        self._keys = itertools.count(first_key)
        self._open_key = next(self._keys)
        self._open: list[int] = []  # positions, row = list index
        self._full: deque[Ready] = deque()
        # grouped / ordered: sampler batches, keyed by their first epoch position
        self._group_of: dict[int, tuple[int, int]] = {}  # position -> (gid, row)
        self._groups: dict[int, list[int]] = {}
        self._filled: dict[int, dict[int, int]] = {}  # gid -> {row: position}
        self._dropped: dict[int, int] = {}  # gid -> samples skipped
        self._order: deque[int] = deque()
        self._complete: deque[int] = deque()
        self._placed = 0  # samples placed and not yet handed out

    # -- input -------------------------------------------------------------------------------
    def add_group(self, gid: int, positions: list[int]) -> None:
        """Register one sampler batch (ignored by ``regroup``). An empty one (a user
        ``batch_sampler`` may yield ``[]``) needs a key of its own: it has no first position."""
        if self.mode == "regroup":
            return
        self._groups[gid] = positions
        self._filled[gid] = {}
        self._dropped[gid] = 0
        if self.mode == "ordered":
            self._order.append(gid)
        for row, p in enumerate(positions):
            self._group_of[p] = (gid, row)
        if not positions:
            self._check_group(gid)

    def place(self, position: int) -> Place:
        """A sample finished: the batch and row it goes to. Call :meth:`pop` afterwards."""
        self._placed += 1
        if self.mode == "regroup":
            place = Place(self._open_key, len(self._open), self.batch_size)
            self._open.append(position)
            if len(self._open) == self.batch_size:
                self._close_open()
            return place
        gid, row = self._group_of.pop(position)
        self._filled[gid][row] = position
        self._check_group(gid)
        return Place(gid, row, len(self._groups[gid]))

    def drop(self, position: int) -> int | None:
        """A sample failed or was skipped: its batch goes out without it. Returns the key of
        the sampler batch it belonged to (``None`` in ``regroup``, where it had no batch yet)."""
        if self.mode == "regroup":
            return None
        gid, _ = self._group_of.pop(position)
        self._dropped[gid] += 1
        self._check_group(gid)
        return gid

    def _close_open(self) -> None:
        rows = list(range(len(self._open)))
        self._full.append(Ready(self._open_key, rows, self._open))
        self._open_key = next(self._keys)
        self._open = []

    def _is_complete(self, gid: int) -> bool:
        return len(self._filled[gid]) + self._dropped[gid] == len(self._groups[gid])

    def _check_group(self, gid: int) -> None:
        if self.mode == "grouped" and self._is_complete(gid):
            self._complete.append(gid)

    # -- output ------------------------------------------------------------------------------
    @property
    def ready_samples(self) -> int:
        """Finished samples not yet handed out in a batch."""
        return self._placed

    def pop(self, final: bool) -> Ready | None:
        """The next batch if one is ready, else ``None``.

        ``final``: no sample of the epoch is left to finish, so a short last batch may go out.
        A sampler batch whose every sample was dropped comes out with no rows (the caller
        yields nothing for it, or raises the error that dropped them).
        """
        if self.mode == "regroup":
            if not self._full and final and self._open:
                self._close_open()
                if self.drop_last:  # short only because samples were skipped or failed
                    self._full[-1] = self._full[-1]._replace(drop=True)
            if not self._full:
                return None
            ready = self._full.popleft()
            self._placed -= len(ready.rows)
            return ready
        while True:
            if self.mode == "ordered":
                if not self._order or not self._is_complete(self._order[0]):
                    return None
                gid = self._order.popleft()
            else:
                if not self._complete:
                    return None
                gid = self._complete.popleft()
            filled = self._filled.pop(gid)
            empty = not self._groups.pop(gid)
            del self._dropped[gid]
            rows = sorted(filled)
            self._placed -= len(rows)
            return Ready(gid, rows, [filled[r] for r in rows], empty=empty)
