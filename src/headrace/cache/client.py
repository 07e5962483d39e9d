"""The cache where a sample runs: look up before the steps, insert after a tier's step.

One ``CacheClient`` per loader (and executed step order) is pickled into every worker (processes
or threads) and used by the ``num_workers=0`` path. Lookups go from the most processed form down;
the first hit gives the value and the step to resume at. Inserts (``cache/insert.py``): the forms a run produces are
encoded (copied out) right after their step, before a later step could write into them, and
when the sample is finished the most processed one that fits its tier's budget is stored (one
form per sample, as in Seneca, where N_A + N_D + N_E <= N_total).

Counters live in shared memory (``cache/counters.py``), one row per worker slot (plus one for
the training process); the loader sums them per epoch.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from headrace.cache import codec
from headrace.cache.config import redact
from headrace.cache.counters import FIELDS, Counters
from headrace.cache.insert import Insert
from headrace.cache.lmdb_envs import StoreClosed
from headrace.cache.tiers import TIERS, TierLayout, sample_key
from headrace.cache.verify import (
    CHECKS_UNVERIFIED,
    CHECKS_VERIFIED,
    DIFFERS,
    VERIFIED,
    Check,
    kept,
)

PROBE_EVERY = 32
"""A tier whose lookups cost more than recomputing its form is still looked up once in this
many lookups, so the comparison follows changes (a cache that got faster)."""
WINDOW = 15
"""Lookup and compute times are the median of this many recent measurements (a reconnect or
a page fault does not switch a tier off)."""
STORE_MARGIN = 3.0
"""A form is stored only when the steps it saves take more than this many times its encoding
(one copy): storing costs two copies, a hit one more (``CacheClient.worth_storing``)."""
MIN_MEASURED = 5
"""Measurements needed before a tier's lookups may be judged not worth making."""
_NONE: frozenset[str] = frozenset()


class CacheClient:
    """Lookups and inserts for one executed step order (picklable).

    ``budgets``: which tiers are active (a tier with no budget is neither looked up nor filled).
    """

    def __init__(
        self, layout: TierLayout, backend: Any, counters: Counters, active: tuple[str, ...]
    ) -> None:
        self.layout = layout
        self.backend = backend
        self.counters = counters
        self.tiers = tuple(t for t in layout.tiers if t.name in active)
        self.at_position = {t.position: t.name for t in self.tiers}
        self._init_local()

    @property
    def ods_tiers(self) -> frozenset[str]:
        """Tiers ODS tracks (Redis, ``Cache(ods=True)``): their reads count references, and
        a full one is tried again (evictions free room at any time)."""
        return getattr(self.backend, "ods_tiers", frozenset())

    def _init_local(self) -> None:
        self.seeded = frozenset(t.name for t in self.tiers if t.seeded)
        """Tiers whose form comes after a random step (exact for one draw of a sample)."""
        self.positions = tuple(sorted(self.at_position))
        """The active tiers' step positions, least processed first."""
        self._in_step_order = tuple(sorted(self.tiers, key=lambda t: t.position))
        self.draws_matter_through = max((t.position for t in self.tiers if not t.seeded),
                                        default=-1)
        """The last step position after which a form that a draw from a global generator
        would make differ each epoch is stored (a tier not ``seeded``); -1: none. A draw at a
        later step changes no form this client stores, so a run need not be watched there
        (``SampleRunner.run``'s ``drew_through``; a draw mark is about 2 µs a step)."""
        self.full: set[str] = set()
        """Tiers found full in this process (not encoded again until the epoch changes)."""
        self._epoch_key: tuple[int, int] | None = None
        self._ns: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._times: dict[tuple[str, int], deque[float]] = {}
        """(tier, 0) lookup seconds, (tier, 1) seconds of the steps the form saves."""
        self._probe = 0
        self._medians: dict[tuple[str, int], float] = {}  # of ``_times``, once measured enough
        self._hits: dict[str, deque[bool]] = {}
        """Per tier, whether its last ``WINDOW`` lookups this epoch found a form."""
        self._encode_s: dict[str, deque[float]] = {}  # tier -> seconds encoding its forms took
        self._encode_median: dict[str, float] = {}  # of ``_encode_s``, once measured enough
        self._store_probe: dict[str, int] = {}
        """Per tier, the times ``worth_storing`` was asked (its one-in-``PROBE_EVERY``)."""
        self._checks: dict[tuple[int, str], tuple[int, int]] = {}
        """(counter row, tier) -> hits checked this epoch, and how many are to be
        (``cache/verify.py``)."""

    def __getstate__(self) -> dict[str, Any]:
        return {"layout": self.layout, "backend": self.backend, "counters": self.counters,
                "tiers": self.tiers}

    def __setstate__(self, s: dict[str, Any]) -> None:
        self.layout, self.backend, self.counters, self.tiers = (
            s["layout"], s["backend"], s["counters"], s["tiers"])
        self.at_position = {t.position: t.name for t in self.tiers}
        self._init_local()

    @property
    def enabled(self) -> bool:
        return bool(self.tiers)

    def namespaces(self, base_seed: int, epoch: int) -> dict[str, bytes]:
        if self._epoch_key != (base_seed, epoch):
            with self._lock:
                self._ns = {t.name: t.namespace(base_seed, epoch) for t in self.tiers}
                self._epoch_key = (base_seed, epoch)
                self.full = set()  # a new epoch may make older entries evictable
                self._checks = {}  # each worker checks its first hits of every epoch
                self._hits = {}  # a new epoch finds what the last one stored
                forget = getattr(self.backend, "forget_full", None)  # the memory backend's
                if forget is not None:  # shards found full, likewise
                    forget()
        return self._ns

    def lookup(self, index: int, base_seed: int, epoch: int, row: int,
               draw: int = 0) -> tuple[int, Any] | None:
        """``(next step, value)`` from the most processed cached form, or None on a miss.
        ``draw`` above 0 (a repeat of its index this epoch, ``runtime/draws.py``): the seeded
        forms are not looked up (they are the first draw's). A form found to differ from what
        its steps compute is not looked up; a hit due for a check (``check_due``) gives a
        ``verify.Check`` as its value: the caller computes the form and compares.

        Raises ``codec.CorruptEntry`` when an entry under a valid key is not in the raw format.
        """
        ns = self.namespaces(base_seed, epoch)
        counters = self.counters
        counters.add(row, "lookups")
        self._probe += 1
        verdicts, ods, skipped = counters.verdicts, self.ods_tiers, 0
        for t in self.tiers:
            if draw and t.seeded or verdicts.state(t.name) == DIFFERS:
                continue
            # an ODS tier is always looked up: ODS chose the sample because it is cached, and
            # the lookup is the use that lets the entry be evicted once every job had it
            if t.name not in ods and not self.worth_looking_up(t.name):
                skipped += 1
                continue
            if skipped:
                counters.add(row, "not_worth", skipped)
                skipped = 0
            key = sample_key(ns[t.name], index)
            check = not t.shared and self.check_due(t.name, row)
            decode = kept if check else codec.decode
            t0 = time.perf_counter()
            try:
                if t.shared or t.name in ods:  # served once / reference-counted
                    value = self.backend.take(key, t.name, decode)
                else:
                    value = self.backend.get(key, decode)
            except codec.CorruptEntry:
                raise
            except Exception as e:  # noqa: BLE001 - continue uncached
                self.failed(row, e)
                return None
            self._record(t.name, 0, time.perf_counter() - t0, row)
            hits = self._hits.get(t.name)
            if hits is None:
                hits = self._hits[t.name] = deque(maxlen=WINDOW)
            hits.append(value is not None)
            if value is not None:
                self.counters.add(row, f"hit_{t.name}")
                if check:
                    done, limit = self._checks[(row, t.name)]
                    self._checks[(row, t.name)] = (done + 1, limit)
                    return t.position + 1, Check(t.name, t.position, value)
                return t.position + 1, value
        if skipped:
            counters.add(row, "not_worth", skipped)
        return None

    def check_due(self, tier: str, row: int) -> bool:
        """A hit of ``tier`` in counter row ``row`` (a worker slot) is to be checked: among
        its first ``CHECKS_UNVERIFIED`` this epoch where the form was not verified when the
        epoch's first was due, its first ``CHECKS_VERIFIED`` where it was (``cache/verify.py``). A seeded form shared across
        epochs (``shared_augmented``) is never checked: it is another epoch's draw by design."""
        done, limit = self._checks.get((row, tier), (0, 0))
        if not done:  # its verdict as the worker's first check of the epoch found it
            limit = (CHECKS_VERIFIED if self.counters.verdicts.state(tier) == VERIFIED
                     else CHECKS_UNVERIFIED)
            self._checks[(row, tier)] = (0, limit)
        return done < limit

    def _median(self, tier: str, which: int) -> float | None:
        m = self._medians.get((tier, which))
        return m if m is not None else self.counters.cost(tier, which)  # else: what other
        # processes or epochs measured

    def _record(self, tier: str, which: int, seconds: float, row: int) -> None:
        key = (tier, which)
        d = self._times.get(key)
        if d is None:
            d = self._times[key] = deque(maxlen=WINDOW)
        m = _add(d, seconds)
        if m is not None:
            self._medians[key] = m
            self.counters.set_cost(row, tier, which, m)

    def encoded(self, tier: str, seconds: float) -> None:
        """A form of ``tier`` was encoded for storing in ``seconds`` (one copy of its bytes)."""
        m = _add(self._encode_s.setdefault(tier, deque(maxlen=WINDOW)), seconds)
        if m is not None:
            self._encode_median[tier] = m

    def worth_storing(self, tier: str) -> bool:
        """False when the steps a form of ``tier`` saves take less than ``STORE_MARGIN`` times
        encoding it (medians of recent measurements), except one in ``PROBE_EVERY`` of the
        times it is asked of ``tier``.

        Storing a form copies it twice (encoded, then written), and a hit copies it out once
        more: a form its steps make in about the time of a copy never pays. A sweep found the
        default cache making a first epoch of 1 MB samples with a cheap decode 2.3x slower
        than without it (16 workers), then skipping most lookups as not worth making."""
        enc = self._encode_median.get(tier)
        cp = self._median(tier, 1)
        if enc is None or cp is None:
            return True
        asked = self._store_probe[tier] = self._store_probe.get(tier, 0) + 1  # per tier: with
        # one count, each run asking two tiers had the probe fall on the second one every time
        return cp > STORE_MARGIN * enc or asked % PROBE_EVERY == 0

    def worth_looking_up(self, tier: str) -> bool:
        """False when a lookup of ``tier`` costs more than what it saves: computing its form
        (medians of recent measurements) times the share of this epoch's recent lookups that
        found one (1 until ``MIN_MEASURED`` were made), except one lookup in
        ``PROBE_EVERY``. A first epoch's lookups all miss: a sweep of tiny samples spent 7 µs a
        sample in the workers looking up forms that were not there."""
        lk, cp = self._median(tier, 0), self._median(tier, 1)
        if lk is None or cp is None or self._probe % PROBE_EVERY == 0:
            return True
        if lk > cp:
            return False
        hits = self._hits.get(tier)
        if hits is None or len(hits) < MIN_MEASURED:
            return True
        return lk <= cp * sum(hits) / len(hits)

    def observe(self, timings: list[Any], row: int) -> None:
        """Learn what each form saves from a run that started at step 0: the wall time of
        the steps up to its position. The form at the layout's last position saves the whole
        run, also where the timings go on past it: a dataset's transforms run inside its
        ``load`` (one unit of work, ``TierLayout``) and are timed as steps of their own."""
        if not timings or timings[0].step != 0:
            return
        spent = 0.0
        at = self.at_position
        last = self.layout.steps - 1
        for t in timings:
            spent += t.wall
            if t.step in at and t.step < last:
                self._record(at[t.step], 1, spent, row)
        if last in at and timings[-1].step >= last:
            self._record(at[last], 1, spent, row)

    def inserter(self, index: int, base_seed: int, epoch: int, start: int, row: int,
                 draw: int = 0) -> Insert | None:
        """An ``Insert`` for a run starting at step ``start``; None when nothing can be stored.
        ``draw`` above 0: the seeded forms are not stored (see ``lookup``). Every tier found
        full this epoch: None, and the run counts once in ``full`` (not stored, not tried).
        Which forms are worth storing is asked here, once a run (``Insert.worth``): with none
        (the cost rule has them off, ``worth_storing``), the ``Insert`` does not ``store``."""
        if not self.positions or self.positions[-1] < start:
            return None
        full = self.full
        if len(full) == len(self.tiers) and all(t.name in full for t in self.tiers):
            self.namespaces(base_seed, epoch)  # resets ``full`` when the epoch changed
            if all(t.name in self.full for t in self.tiers):
                self.counters.add(row, "full")
                return None
        ns = self.namespaces(base_seed, epoch)
        ods, verdicts, worth = self.ods_tiers, self.counters.verdicts, _NONE
        for t in self._in_step_order:  # the cost rule asked of the forms ``after_step``
            # asks it of, in its order (its probe counts one a form a run, as there)
            name = t.name
            if (t.position >= start and name not in self.full and not (draw and t.seeded)
                    and verdicts.state(name) != DIFFERS
                    and (name in ods or self.worth_storing(name))):
                worth = worth | {name}
        return Insert(self, index, ns, row, seeded_ok=not draw, worth=worth)

    def failed(self, row: int, e: BaseException) -> None:
        """A backend error: counted, and the row's first kept for the training process, which
        logs it once per loader (``CacheSession.warn_failed``); the sample runs uncached.
        A cache closed for good under a worker thread that outlived its loader
        (``lmdb_envs.StoreClosed``) is the shutdown, not a failure: neither."""
        if isinstance(e, StoreClosed):
            return
        self.counters.add(row, "errors")  # redacted before the text is cut to its row's
        # bytes: a URL cut before its "@" cannot be redacted later
        self.counters.note_failure(row, redact(f"{type(e).__name__}: {e}"))


__all__ = ["FIELDS", "TIERS", "CacheClient", "Counters"]


def _add(d: deque[float], seconds: float) -> float | None:
    """Append a measurement (seconds); the window's median once it holds ``MIN_MEASURED``."""
    d.append(seconds)
    n = len(d)
    if n < MIN_MEASURED:
        return None
    s = sorted(d)  # ``statistics.median``'s value, without its checks (a run's bookkeeping)
    h = n // 2
    return s[h] if n % 2 else (s[h - 1] + s[h]) / 2
