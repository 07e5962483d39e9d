"""Which draw of a sample a position is, within one epoch (pure bookkeeping).

A sampler with replacement (``WeightedRandomSampler(..., replacement=True)``, oversampling a
rare class) yields one index several times an epoch. A sample's seed is a function of (base
seed, epoch, index): every copy would draw the same augmentation, where torch's workers draw
a fresh one each time. So the n-th time an index comes in an epoch (counted from 0, in the
sampler's order) its seed takes n as well (``seeding.sample_root``'s ``draw``); the first
copy keeps the seed it always had. The count runs over every position, delivered ones too,
so a resumed epoch gives each position the draw it had.

Memory: a bit per integer index below ``BITMAP_LIMIT`` (growable), a set of the other keys
(about 80 bytes each), and a count per index seen more than once; nothing for the samplers
that cannot repeat an index (``may_repeat``: torch's sequential sampler and its random one
without replacement, ``shuffle=False`` and ``shuffle=True``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch.utils.data as tud

from headrace.pipeline.seeding import index_key
from headrace.runtime.bitmap import Bitmap


def may_repeat(sampler: Any, user_batch_sampler: bool) -> bool:
    """Whether the loader's index sampler may yield an index twice in an epoch: False for
    torch's ``SequentialSampler`` and ``RandomSampler(replacement=False)`` (whatever their
    subclass adds, its own sampler may repeat), True for anything else, a batch sampler of the
    user's included."""
    if user_batch_sampler:
        return True
    if type(sampler) is tud.SequentialSampler:
        return False
    return not (type(sampler) is tud.RandomSampler and not sampler.replacement)


BITMAP_LIMIT = 1 << 27
"""Integer indices below this are remembered in a bitmap (at most 16 MB); others in a set."""


class Draws:
    """Counts, over one epoch, how many times each sampler key came before."""

    __slots__ = ("_other", "_repeats", "_seen", "counting")

    def __init__(self, counting: bool = True) -> None:
        self.counting = counting  # False: the sampler cannot repeat (``may_repeat``): all 0
        self._seen = Bitmap()
        self._other: set[int] = set()
        self._repeats: dict[int, int] = {}

    def next(self, index: Any) -> int:
        """How many times ``index`` came earlier in this epoch (0: its first time)."""
        if not self.counting:
            return 0
        key = index if type(index) is int and index >= 0 else index_key(index)
        if key < BITMAP_LIMIT:
            if self._seen.set(key):
                return 0
        elif key not in self._other:
            self._other.add(key)
            return 0
        n = self._repeats.get(key, 0) + 1
        self._repeats[key] = n
        return n

    def repeats(self, positions: Iterable[int], indices: Iterable[Any]) -> dict[int, int]:
        """Count a sampler group (its positions and indices, in order): position -> draw, for
        the positions whose index came before (the others are draw 0)."""
        if not self.counting:
            return {}
        return {p: n for p, i in zip(positions, indices, strict=True) if (n := self.next(i))}
