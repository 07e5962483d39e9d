"""Where a user ``collate_fn`` runs, so that its random draws are reproducible.

torch's workers collate, each drawing from its own generators seeded at start, so a collator
that draws from the global generators (masking for masked language modelling, mixup) gives the
same batches run after run and leaves the training loop's generators alone. headrace collates
in the training process (``runtime/output.py``); on a collate thread such a collator draws from
the generators the training loop draws from at the same moment (dropout), so both streams would
depend on thread timing, run to run.

So the first ``PROBE_BATCHES`` batches of a loader with a user ``collate_fn`` are collated in the
training loop's own thread, inside ``next()``, each under the global generators seeded for that
batch and restored afterwards, watching whether the call moved them. A collator that drew stays
there for the loader's life (``"loop"``): its batches depend on the seed and the batch alone,
and the training loop's stream is never touched. One that did not moves to the collate threads
(``"threads"``), where an expensive collator overlaps the training step. A collator that draws
only on rare batches after the probe is not caught (``explain()`` says which was chosen).

The seed of a batch: (base seed, epoch, the batch's key), the key being the sampler batch's
first epoch position (``in_order=True``, a user batch sampler: the same in every run and after a
resume) or, when batches are regrouped, the batch's number in the epoch (a resumed epoch
numbers past the batches it delivered). The sampler is read in the training thread too
(``runtime/feed.py``), so never inside a seeded window, and no two calls of the collate_fn
overlap across the move to the collate thread (``CollatePlace.one_at_a_time``). Not used with ``executor="threads"``, whose worker
threads draw from the same global generators whenever they run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from torch.utils.data._utils import collate as torch_collate

from headrace.pipeline.draw_marks import draw_mark
from headrace.pipeline.seeding import (
    global_states,
    restore_globals,
    sample_seed,
    seed_globals,
    step_key,
)

PROBE_BATCHES = 4
"""Batches collated in the training loop, watched, before a collator that never drew moves to
the collate threads."""
_KEY = step_key("collate_fn")


def one_at_a_time(place: CollatePlace, collate: Callable[[], Any]) -> Any:
    """``collate()`` on a collate thread, never beside another call of the same collate_fn."""
    with place.one_at_a_time:
        return collate()


def place_for(collate_fn: Any, kept: CollatePlace | None) -> CollatePlace | None:
    """The decision for ``collate_fn``: ``kept`` while it is that function's, a new one for
    another, ``None`` for torch's own collate functions (they draw nothing)."""
    if collate_fn is torch_collate.default_collate or collate_fn is torch_collate.default_convert:
        return None
    return kept if kept is not None and kept.fn is collate_fn else CollatePlace(collate_fn)


class CollatePlace:
    """The decision for one loader's ``collate_fn``, kept across its epochs: ``mode`` is
    ``"probe"`` until ``PROBE_BATCHES`` calls were watched (or one drew), then ``"loop"`` or
    ``"threads"``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn  # the collate_fn decided for
        self.one_at_a_time = threading.Lock()
        """Held by each call, in the loop or on the one collate thread, so none overlap: the
        batches queued for the loop while it was watched still run there after the move."""
        self.watched = 0  # calls watched so far
        self.drew = False  # one of them moved a global generator

    @property
    def mode(self) -> str:
        if self.drew:
            return "loop"
        return "threads" if self.watched >= PROBE_BATCHES else "probe"

    def observe(self, drew: bool) -> None:
        self.watched += 1
        self.drew = self.drew or drew

    def describe(self) -> str:
        """``explain()``'s line."""
        if self.drew:
            return ("collate_fn: it draws from the global random generators, so it runs in the "
                    "training loop's thread, seeded per batch (reproducible; the loop's own "
                    "draws untouched), not on a collate thread")
        if self.mode == "threads":
            return (f"collate_fn: drew no random number in {self.watched} batches watched, so "
                    "it runs on the collate thread, beside the training step")
        return (f"collate_fn: watched in the training loop's thread ({self.watched} of "
                f"{PROBE_BATCHES} batches) for draws from the global random generators")


def collated_in_loop(collate: Callable[[], Any], place: CollatePlace, base_seed: int,
                     epoch: int, key: int) -> Any:
    """``collate()`` in the calling (training) thread under the global generators seeded for
    batch ``key``; the caller's generator states come back afterwards, whatever happens.
    While ``place`` probes, tells it whether the call moved a generator."""
    saved = global_states()
    try:
        seed_globals(sample_seed(base_seed, epoch, key, _KEY))
        seeded = draw_mark() if place.mode == "probe" else None
        with place.one_at_a_time:
            out = collate()
        if seeded is not None:
            place.observe(draw_mark() != seeded)
        return out
    finally:
        restore_globals(saved)
