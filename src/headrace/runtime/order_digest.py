"""Whether a resumed epoch's sampler gave the saved epoch's order.

A state dict records what an epoch delivered by position in its sampler's order, and a resume
replays that order from the RNG states the epoch started from (``runtime/drawing.py``). A
sampler that draws as it goes (an index or a batch size drawn at every element from a global
generator, a shuffle seeded from the clock) gives another order then: the positions delivered
before hold other samples, and the resumed epoch delivers some samples twice and never others.
Nothing said so.

So an epoch keeps a digest of the indices it read, in order (:class:`OrderDigest`, about
0.2 µs a position), marked after each sampler element; the state dict saves the first mark at
or past its last delivered position (``order_digest``: how many positions, their digest), and
a resumed epoch compares its own digest at that many positions, whatever batches it reads them
in, with a warning that names the mismatch (``ReplayOrderWarning``). Positions read ahead and
not delivered may differ harmlessly, and are left out where the marks allow. A warning, not a refusal: such a sampler (a random one
with replacement) is often one whose repeats do not matter, and a refused resume stops a run.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Iterator
from typing import Any

from headrace.errors import ReplayOrderWarning
from headrace.pipeline.seeding import index_key

_MOD = (1 << 61) - 1
_MUL = 1_000_003
MARKS = 4096
"""Marks kept, the latest: the positions read and not yet delivered when a state dict is
taken are at most the epoch's in-flight bound, one sampler element each at worst."""


class OrderDigest:
    """The positions an epoch read from its sampler (``read``) and a digest of their indices,
    in order (``digest``); ``expect``: the saved epoch's ``(read, digest)`` a resumed epoch
    compares its own with once it has read that many positions (``None``: not a resume);
    ``cause``: what the warning blames where the likely cause is known (else a sampler that
    draws as it goes)."""

    def __init__(self, expect: tuple[int, int] | None = None, cause: str | None = None) -> None:
        self.read = 0
        self.digest = 0
        self.expect = expect
        self.cause = cause
        self.mismatch = False  # the replay gave another order (warned once)
        self._marks: deque[tuple[int, int]] = deque(maxlen=MARKS)  # (read, digest) per element

    def saved(self, upto: int) -> tuple[int, int] | None:
        """What a state dict records when the epoch's positions before ``upto`` hold all it
        delivered: the first mark at or past ``upto`` (this epoch's reads so far where the
        marks kept go no further back), or the saved epoch's while this resumed one has not
        read as far; None when ``upto`` is 0 (nothing delivered: nothing to compare)."""
        if upto <= 0:
            return None
        if self.expect is not None and self.read < self.expect[0]:
            return self.expect
        return next((m for m in self._marks if m[0] >= upto), (self.read, self.digest))

    def wrap(self, groups: Iterator[Any], auto_collation: bool) -> Iterator[Any]:
        """``groups`` (the sampler's elements: batches of indices when ``auto_collation``, else
        indices), read through this digest; a batch comes as a list (read once)."""
        return _Digesting(self, groups, auto_collation)

    def add(self, indices: Any) -> None:
        """One sampler element's indices, read."""
        h, n = self.digest, self.read
        expect = self.expect
        at = expect[0] if expect is not None and n < expect[0] else -1
        for k in indices:
            k = k if type(k) is int and k >= 0 else index_key(k)
            h = (h * _MUL + k + 1) % _MOD
            n += 1
            if n == at and expect is not None and h != expect[1]:
                self._warn()
        self.digest, self.read = h, n
        self._marks.append((n, h))

    def ended(self) -> None:
        """The sampler ended: a replay shorter than the saved reads gave another order."""
        if self.expect is not None and self.read < self.expect[0]:
            self._warn()

    def _warn(self) -> None:
        if self.mismatch:
            return
        self.mismatch = True
        assert self.expect is not None
        warnings.warn(
            f"headrace: the sampler did not give the saved epoch's order again: its first "
            f"{self.expect[0]} positions hold other indices than when the state dict was saved, "
            "so the positions delivered before now hold other samples, and this epoch may "
            "deliver some samples twice and others never. " + (self.cause or (
                "The sampler draws its order as it goes (from a global generator after its "
                "first element, or from the clock): give it a torch.Generator as its "
                "`generator` attribute, or draw the epoch's order in __iter__ or at its first "
                "element (docs/reliability.md)")), ReplayOrderWarning, stacklevel=2)


class _Digesting:
    """``groups`` read through an :class:`OrderDigest`; only ``next()`` (a sampler whose
    ``__iter__`` returns itself and starts over must not be restarted: ``drawing._after``)."""

    def __init__(self, order: OrderDigest, groups: Iterator[Any], auto: bool) -> None:
        self._order = order
        self._groups = groups
        self._auto = auto

    def __iter__(self) -> _Digesting:
        return self

    def __next__(self) -> Any:
        try:
            group = next(self._groups)
        except StopIteration:
            self._order.ended()
            raise
        if self._auto:
            group = list(group)  # a batch sampler may yield generators: read once
            self._order.add(group)
        else:
            self._order.add((group,))
        return group
