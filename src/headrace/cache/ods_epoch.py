"""ODS in a running epoch (training process): sampler positions in, the samples to run out.

The hook between the runtime and ``cache.ods``: the scheduler's ``Lanes.pull_group`` (and the
``num_workers=0`` loop) hand it each sampler batch; it asks the shared cache (``OdsBoard.ask``,
one request per sampler batch), lets ``ods.Substitution`` choose, and remembers which index
fills each position until the training loop receives it (``index_of``, asked by
``EpochBase.deliver``), so the delivered set is recorded by sample: with substitution a position
no longer says which sample it delivered, and a resume replays the sampler and skips the
positions whose *sampler index* was delivered (``ods.py`` says why that leaves exactly the rest).
"""

from __future__ import annotations

from collections.abc import Sequence

from headrace.cache.ods import NO_ANSWER, Substitution
from headrace.cache.ods_board import OdsBoard
from headrace.runtime.bitmap import Bitmap

MAX_PENDING_MARKS = 4096
"""Chosen indices waiting to be marked seen on the server (sent with the next request); beyond
this (the server down for long) the oldest are dropped: the server's seen bits only filter
candidates, the job's own ``Substitution.seen`` decides."""


class OdsEpoch:
    """One epoch's ODS. ``resumed``: indices delivered before (a resumed epoch), by sample."""

    def __init__(self, board: OdsBoard, epoch: int, resumed: Bitmap) -> None:
        self.board = board
        self.epoch = epoch
        self.resumed = resumed.copy()  # a snapshot: ``resumed`` grows as batches are delivered
        self.policy = Substitution(resumed.copy())
        self._at: dict[int, int] = {}  # position -> index, from dispatch until delivered
        self._marks: list[int] = []
        self.errors0 = board.errors
        """The board's failed requests before this epoch (stats count this epoch's)."""
        board.start_epoch(epoch, self.resumed.raw())

    def fill(self, positions: Sequence[int], indices: Sequence[int]) -> list[tuple[int, int]]:
        """``(position, index to run)`` for one sampler batch; positions whose sampler index
        was delivered before the resume are left out."""
        todo = [(p, i) for p, i in zip(positions, indices, strict=True) if i not in self.resumed]
        if not todo:
            return []
        requested = [i for _, i in todo]
        answer = self.board.ask(self.epoch, requested, len(requested), self._marks)
        if answer is not NO_ANSWER:
            self._marks = []
        chosen = self.policy.fill(requested, answer)
        self._marks = (self._marks + chosen)[-MAX_PENDING_MARKS:]
        out = [(p, c) for (p, _), c in zip(todo, chosen, strict=True)]
        self._at.update(out)
        return out

    def index_of(self, position: int) -> int:
        """The index that fills ``position`` (dispatched, not yet delivered)."""
        return self._at[position]

    def forget(self, positions: Sequence[int]) -> None:
        """``positions`` are delivered: their indices are asked no more."""
        for p in positions:
            self._at.pop(p, None)

    def keep(self, positions: Sequence[int], indices: Sequence[int]) -> None:
        """A delivery of ``positions`` was undone (an interrupt): their indices are asked
        again when the batch comes back, whether or not :meth:`forget` ran."""
        self._at.update(zip(positions, indices, strict=True))

    @property
    def substituted(self) -> int:
        return self.policy.substituted
