"""What one run of a sample inserts into the cache (``Insert``, made by
``CacheClient.inserter``): the forms its steps produce, encoded right after their step, and the
most processed one that fits stored when the run ends; or, for a run that stores none, what it
would have counted (``settle``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from headrace.cache import codec
from headrace.cache.tiers import sample_key
from headrace.cache.verify import DIFFERS

if TYPE_CHECKING:
    from headrace.cache.client import CacheClient

MAY_HAVE_DRAWN = -1
"""``drew_at`` of a part run without its draws watched (it stored nothing, ``Insert.stores``)
and handed off: no step is known to have drawn, any may have (``cache/running.py``). The rest
stores no unseeded form, counted in ``not_stored``."""


class Insert:
    """What one run of a sample will insert: collects tier forms as their steps finish.

    Whether each form is worth storing is asked once, when the run starts
    (``CacheClient.inserter``); a run where none is (the cost rule has every form off, as
    for most samples of cheap steps) runs without the cache's hooks (``stores``)."""

    __slots__ = ("client", "drew_at", "forms", "index", "namespaces", "row", "seeded_ok",
                 "skipped_full", "worth")

    def __init__(self, client: CacheClient, index: int, namespaces: dict[str, bytes], row: int,
                 seeded_ok: bool, worth: frozenset[str]):
        self.client = client
        self.index = index
        self.namespaces = namespaces
        self.row = row
        self.seeded_ok = seeded_ok  # False: a repeat of its index (its seeded forms are its own)
        self.worth = worth
        """The tiers whose forms this run stores (an ODS one, or one worth storing: the cost
        rule asked once a run, in ``CacheClient.inserter``)."""
        self.forms: list[tuple[str, bytes]] = []  # (tier, blob), least processed first
        self.drew_at: int | None = None
        """The first step of this run that drew from a global random generator
        (``MAY_HAVE_DRAWN``: an earlier part, not watched, may have drawn)."""
        self.skipped_full = False
        """A form was not encoded because its tier was found full earlier this epoch."""

    @property
    def stores(self) -> bool:
        """Whether this run may store a form. A run that stores none needs neither
        ``after_step`` at each step nor its draws watched: ``run_cached`` runs it plain and
        counts its forms afterwards (``settle``)."""
        return bool(self.worth)

    def settle(self, start: int, end: int, commit: bool = True) -> None:
        """For a run that stores nothing (``stores`` False): count what ``after_step`` would
        have counted for the forms of its steps ``start..end-1``, and, with ``commit`` (the
        run did not fail), what ``commit`` would have (``full``)."""
        c = self.client
        worth, skipped = self.worth, 0
        for position in c.positions:
            if start <= position < end:
                tier = c.at_position[position]
                if c.counters.verdicts.state(tier) == DIFFERS:
                    continue
                if tier in c.full:
                    self.skipped_full = True
                elif not self.seeded_ok and tier in c.seeded:
                    continue
                elif tier not in worth:
                    skipped += 1
                elif self.drew_at is not None and tier not in c.seeded:
                    c.counters.add(self.row, "drew" if self.drew_at >= 0 else "not_stored")
        if skipped:
            c.counters.add(self.row, "not_stored", skipped)
        if commit and self.skipped_full:
            c.counters.add(self.row, "full")

    def drew(self, position: int) -> None:
        """Called by the runner when the step at ``position`` drew from Python's, NumPy's or
        torch's global generator: the forms from there on differ from epoch to epoch (a step
        not declared ``random=True``, a torchvision transform), so none is stored as a form
        every epoch may read."""
        if self.drew_at is None:
            self.drew_at = position

    def after_step(self, position: int, value: Any) -> None:
        """Called by the runner after each step with its output."""
        c = self.client
        tier = c.at_position.get(position)
        if tier is None or c.counters.verdicts.state(tier) == DIFFERS:  # not what it computes
            return
        if tier in c.full:  # counted in ``commit`` unless another form is stored
            self.skipped_full = True
            return
        if not self.seeded_ok and tier in c.seeded:
            return
        if tier not in self.worth:
            c.counters.add(self.row, "not_stored")  # before ``drew``: a run storing nothing
            # is not watched for draws (``stores``)
            return
        if self.drew_at is not None and tier not in c.seeded:
            c.counters.add(self.row, "drew" if self.drew_at >= 0 else "not_stored")
            return
        t0 = time.perf_counter()
        try:
            blob = codec.encode(value)
        except Exception:  # noqa: BLE001 - Uncacheable, or a value that fails to encode (a
            # conjugate view's .numpy(), a string with a lone surrogate): never the sample's
            c.counters.add(self.row, "uncacheable")
            return
        c.encoded(tier, time.perf_counter() - t0)
        self.forms.append((tier, blob))

    def commit(self) -> None:
        """Store the most processed collected form whose tier has room. A run that stores
        nothing because its forms' tiers were full (refused now, or found full earlier this
        epoch) counts once in ``full``."""
        c = self.client
        live = list(self.namespaces.values())
        refused = self.skipped_full
        for tier, blob in reversed(self.forms):
            key = sample_key(self.namespaces[tier], self.index)
            try:
                r = c.backend.put(key, tier, blob, live)
            except Exception as e:  # noqa: BLE001 - a broken cache must not break training
                c.failed(self.row, e)
                return
            if r == "stored":
                c.counters.add(self.row, "inserts")
                return
            if r == "exists":
                return
            if r == "full" and tier not in c.ods_tiers:  # not "shard_full": other shards of
                c.full.add(tier)  # the memory backend have room
            refused = True
        if refused:  # once a run, however many of its forms were kept out
            c.counters.add(self.row, "full")
