"""The cache's shared counters: one row per worker slot (plus one for the training process),
each written by one writer only, so no lock is needed; the loader sums them per epoch
(``cache/session.py``), workers and the training process write them (``cache/client.py``)."""

from __future__ import annotations

from typing import Any

from headrace.cache.tiers import TIERS
from headrace.cache.verify import Verdicts

FIELDS = ("lookups", "hit_encoded", "hit_decoded", "hit_augmented", "inserts", "uncacheable",
          "full", "errors", "not_worth", "not_stored", "drew", "checked", "differed")
"""Counter columns (see ``telemetry.stats.CacheStats`` for their meaning)."""
_F = {n: i for i, n in enumerate(FIELDS)}


class Counters:
    """Shared per-slot counters: ``rows`` writers (worker slots, then the training process).

    ``costs``: per row and tier, the seconds of a lookup and of computing the form (medians a
    process measured), so a new worker or a new epoch starts from what others measured.
    ``verdicts``: each form's check (``cache/verify.py``), so a form found to differ is off in
    every worker.
    """

    def __init__(self, ctx: Any, rows: int) -> None:
        self.rows = rows
        self.values = ctx.RawArray("q", rows * len(FIELDS))
        self.costs = ctx.RawArray("d", rows * len(TIERS) * 2)
        self.verdicts = Verdicts(ctx)

    def set_cost(self, row: int, tier: str, which: int, seconds: float) -> None:
        self.costs[(row * len(TIERS) + TIERS.index(tier)) * 2 + which] = seconds

    def cost(self, tier: str, which: int) -> float | None:
        """Mean over the rows that measured it (None: nobody has)."""
        k = TIERS.index(tier)
        xs = [self.costs[(r * len(TIERS) + k) * 2 + which] for r in range(self.rows)]
        xs = [x for x in xs if x > 0]
        return sum(xs) / len(xs) if xs else None

    def add(self, row: int, field: str, n: int = 1) -> None:
        self.values[row * len(FIELDS) + _F[field]] += n

    def totals(self) -> dict[str, int]:
        k = len(FIELDS)
        v = self.values[:]
        return {f: sum(v[r * k + i] for r in range(self.rows)) for i, f in enumerate(FIELDS)}
