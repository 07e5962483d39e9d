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
_TIER = {n: i for i, n in enumerate(TIERS)}
FAILURE_BYTES = 256
"""Bytes kept of a row's first failure ("type: message", UTF-8; longer ones are cut)."""


class Counters:
    """Shared per-slot counters: ``rows`` writers (worker slots, then the training process).

    ``costs``: per row and tier, the seconds of a lookup and of computing the form (medians a
    process measured), so a new worker or a new epoch starts from what others measured.
    ``verdicts``: each form's check (``cache/verify.py``), so a form found to differ is off in
    every worker. ``failures``: per row, the first backend failure its writer saw
    (``note_failure``), which the training process logs once per loader, as soon as it sees
    it (``cache/failure_log.py``, while an epoch runs): a worker's own log line
    repeated with every worker of every epoch (a fresh process each) and never reached the
    training process's logging.
    """

    def __init__(self, ctx: Any, rows: int) -> None:
        self.rows = rows
        self.values = ctx.RawArray("q", rows * len(FIELDS))
        self.costs = ctx.RawArray("d", rows * len(TIERS) * 2)
        self.verdicts = Verdicts(ctx)
        self.failures = ctx.RawArray("c", rows * FAILURE_BYTES)

    def set_cost(self, row: int, tier: str, which: int, seconds: float) -> None:
        self.costs[(row * len(TIERS) + _TIER[tier]) * 2 + which] = seconds

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

    def note_failure(self, row: int, text: str) -> None:
        """Keep ``text`` as row ``row``'s first failure; later ones are not kept (one writer
        per row: its first byte, written last, says the text is complete)."""
        at = row * FAILURE_BYTES
        if self.failures[at] != b"\0":
            return
        b = (text.encode("utf-8", "replace") or b"?")[:FAILURE_BYTES - 1]
        self.failures[at + 1:at + len(b)] = b[1:]
        self.failures[at] = b[:1]

    def first_failure(self) -> str | None:
        """The failure kept by the lowest row that kept one (None: no row did). Cheap while
        none did (one strided read of the rows' first bytes, under a microsecond for 65 rows),
        as the training process asks at every scheduler tick and every few samples
        (``cache/failure_log.py``)."""
        heads = self.failures[::FAILURE_BYTES]
        r = len(heads) - len(heads.lstrip(b"\0"))  # the first row whose first byte is set
        if r == len(heads):
            return None
        at = r * FAILURE_BYTES
        raw = bytes(self.failures[at:at + FAILURE_BYTES]).split(b"\0", 1)[0]
        return raw.decode("utf-8", "replace")
