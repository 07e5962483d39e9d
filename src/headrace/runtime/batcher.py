"""Batch formation from finished samples (pure; no threads, no processes).

Three ways to group, chosen by the loader:

* ``regroup`` (default, sample-aware): any ``batch_size`` finished samples form the next batch,
  fast-lane samples first, then slow-lane ones (MinatoLoader Algorithm 1, lines 20-30). Used with
  torch's default BatchSampler, whose grouping carries no meaning beyond its size.
* ``ordered`` (``in_order=True``): the sampler's batches, in the sampler's order: torch's order
  and batches exactly.
* ``grouped``: the sampler's batches kept whole but yielded as soon as complete. Used with a
  user-given ``batch_sampler`` (its grouping may mean something, e.g. length buckets) and with
  ``batch_size=None``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Literal

Mode = Literal["regroup", "ordered", "grouped"]
Item = tuple[int, Any]  # (epoch position, sample)


class Batcher:
    def __init__(self, mode: Mode, batch_size: int | None) -> None:
        if mode == "regroup" and not batch_size:
            raise ValueError("regroup needs a batch size")
        self.mode = mode
        self.batch_size = batch_size or 1
        self._fast: deque[Item] = deque()
        self._slow: deque[Item] = deque()
        # grouped / ordered bookkeeping
        self._group_of: dict[int, int] = {}
        self._groups: dict[int, list[int]] = {}
        self._done: dict[int, dict[int, Any]] = {}
        self._order: deque[int] = deque()
        self._complete: deque[int] = deque()
        self._dropped: set[int] = set()

    # -- input -------------------------------------------------------------------------------
    def add_group(self, gid: int, positions: list[int]) -> None:
        """Register one sampler batch (ignored by ``regroup``)."""
        if self.mode == "regroup":
            return
        self._groups[gid] = positions
        self._done[gid] = {}
        if self.mode == "ordered":
            self._order.append(gid)
        for p in positions:
            self._group_of[p] = gid

    def complete(self, position: int, sample: Any, slow: bool = False) -> None:
        """A sample finished (``slow``: it went through the slow lane)."""
        if self.mode == "regroup":
            (self._slow if slow else self._fast).append((position, sample))
            return
        gid = self._group_of.pop(position)
        done = self._done[gid]
        done[position] = sample
        self._check_group(gid)

    def drop(self, position: int) -> None:
        """A sample was skipped (``on_error="skip"``): its batch goes out without it."""
        if self.mode == "regroup":
            return
        gid = self._group_of.pop(position)
        self._dropped.add(position)
        self._check_group(gid)

    def _check_group(self, gid: int) -> None:
        members = self._groups[gid]
        done = self._done[gid]
        if self.mode == "grouped" and len(done) + sum(p in self._dropped for p in members) == len(
            members
        ):
            self._complete.append(gid)

    # -- output ------------------------------------------------------------------------------
    @property
    def ready_samples(self) -> int:
        """Finished samples not yet handed out in a batch."""
        if self.mode == "regroup":
            return len(self._fast) + len(self._slow)
        return sum(len(d) for d in self._done.values())

    def pop(self, final: bool) -> list[Item] | None:
        """The next batch if one is ready, else ``None``.

        ``final``: no sample of the epoch is left to finish, so a short last batch may go out.
        """
        if self.mode == "regroup":
            n = len(self._fast) + len(self._slow)
            if n == 0 or (n < self.batch_size and not final):
                return None
            take = min(n, self.batch_size)
            out: list[Item] = []
            while len(out) < take and self._fast:
                out.append(self._fast.popleft())
            while len(out) < take:
                out.append(self._slow.popleft())
            return out
        while True:
            if self.mode == "ordered":
                if not self._order:
                    return None
                gid = self._order[0]
                members = self._groups[gid]
                if len(self._done[gid]) + sum(p in self._dropped for p in members) < len(members):
                    return None
                self._order.popleft()
            else:
                if not self._complete:
                    return None
                gid = self._complete.popleft()
                members = self._groups[gid]
            done = self._done.pop(gid)
            del self._groups[gid]
            items = [(p, done[p]) for p in members if p in done]
            self._dropped.difference_update(members)
            if items:
                return items
            # every sample of this batch was skipped: nothing to yield, look further
