"""Workers still starting, as one epoch's scheduler sees them (``runtime/scheduler.py``, under
its lock): whether the epoch's first batch waits for them, and what its end hears from them.

A worker's ``worker_init_fn`` that raises sends ``("init_error", ...)`` (``runtime/worker.py``),
which the scheduler raises to the training loop when it reads it. The pool's first workers get
their samples before they are ready (``WorkerPool.start``), so the others could fill batches
first, and the error came at a random point of the epoch: in 4 runs of 20 (one worker of three
failing, 12 samples) only after the training loop had taken the whole epoch; torch, whose
every worker takes its turn, raises it at that worker's first batch, every time. So with a
``worker_init_fn``, the epoch's first batch waits until every worker of the pool has said it is
ready or why it is not (``Starts.hold``): the error comes before any batch, every run. Without
one nothing waits (a dataset's setup failing in a worker is rare, and the wait is the first
batch's): workers that start later (the scaler's, a replacement) are heard when read, and at
the epoch's end (``Starts.read``), which never passes for the end while one failed.

A worker whose start failed is not replaced (``WorkerPool.failed_slots``): its replacement ran
the same ``worker_init_fn``, failed the same way, and, with ``persistent_workers``, that error
came in whichever later epoch its message was read, before its first batch, after its last
one, or not at all (a hunt's find; torch raises it once and its persistent worker serves the
later epochs). So an epoch whose first batch waits hears every first worker, then raises the
failure of the lowest slot (torch's, whose worker 0 takes the first batch) and logs the others;
the next epoch of persistent workers drops them (``forget_failed``) and runs on the workers that
started. When none did, the pool starts them all again (``runtime/epochs.py``: an empty pool),
and that epoch raises again, as without persistent workers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from headrace.runtime.handles import WorkerHandle
from headrace.runtime.pool import WorkerPool
from headrace.runtime.work import Fatal

log = logging.getLogger("headrace")

START_WAIT_S = 5.0
"""Longest an epoch's end waits to hear whether workers still starting started (seconds)."""
START_HOLD_S = 30.0
"""Longest the epoch's first batch waits for a worker whose ``worker_init_fn`` has not returned
(seconds from that worker's start): one that never returns would hold the epoch for ever, where
the other workers can run it (its error, if one comes, is raised when it is read)."""


class Starts:
    """The starts of one epoch's workers. ``handle(w, msg)``: the scheduler's handling of a
    worker's message (an ``init_error`` raises ``Fatal``)."""

    def __init__(self, pool: WorkerPool, handle: Callable[[WorkerHandle, Any], None]) -> None:
        self.pool = pool
        self.handle = handle
        self.holding = pool.worker_init_fn is not None
        """The epoch's first batch has not gone out and waits for the workers' starts."""
        self._since = time.monotonic()  # when the epoch began (s): before its first fork
        self._warned: set[int] = set()  # slots whose start the hold stopped waiting for
        self._failed: dict[int, BaseException] = {}  # slot -> its start's error, while holding

    def forget_failed(self) -> None:
        """At a persistent pool's next epoch: drop the workers whose start failed (their
        error was raised in the epoch that heard it); the epoch runs on the others."""
        slots = self.pool.drop_failed()
        if slots and not self.pool.workers:  # the epoch starts them all again
            log.warning("headrace: no worker started (worker_init_fn or dataset setup failed "
                        "in workers %s); starting them again", slots)
            return
        for slot in slots:
            log.warning("headrace worker %d: its worker_init_fn (or dataset setup) failed; the "
                        "persistent workers go on without it", slot)

    def failed(self, w: WorkerHandle, error: BaseException) -> None:
        """``w``'s ``worker_init_fn`` (or dataset setup) raised: no worker starts in its slot
        again while the pool lives. ``error`` ends the epoch (``Fatal``): now, or, while the
        first batch waits for the pool's first workers, once all of them are heard
        (``hold``)."""
        if w.external:  # a backend's worker: its backend decides about its slot
            raise Fatal(error)
        self.pool.failed_slots.add(w.slot)
        self._failed[w.slot] = error
        if not self.holding:
            self._raise_failed()

    def _raise_failed(self) -> None:
        """End the epoch with the lowest slot's start error; log the others'."""
        first, *others = sorted(self._failed)
        for slot in others:
            log.warning("headrace: also %s", str(self._failed[slot]).split("\n", 1)[0])
        error = self._failed[first]
        self._failed.clear()
        raise Fatal(error)

    def hold(self) -> bool:
        """Whether no batch may go out yet: a ``worker_init_fn`` runs, and the pool has not
        forked its first workers yet, or one of its worker processes has not said it is ready
        (nor failed), for less than ``START_HOLD_S``. False from the first time it is False on
        (a worker started later holds nothing); raises ``Fatal`` then if a start failed."""
        if not self.holding:
            return False
        now = time.monotonic()
        workers = list(self.pool.workers.values())
        if self.pool.starting or not workers and now - self._since < START_HOLD_S:
            return True  # (the scheduler's first pass comes before the pool's first fork)
        for w in workers:
            if w.ready or w.is_thread or w.external or w.retiring or w.slot in self._failed:
                continue
            if now - w.started < START_HOLD_S:
                return True
            if w.slot not in self._warned:  # (once: this runs at every scheduler pass)
                self._warned.add(w.slot)
                log.warning("headrace worker %d: worker_init_fn has not returned after %.0f "
                            "s; the epoch's first batch does not wait for it any more",
                            w.slot, START_HOLD_S)
        self.holding = False
        if self._failed:
            self._raise_failed()
        return False

    def read(self) -> None:
        """Before the epoch ends, hear how the workers that never became ready started, for
        up to ``START_WAIT_S`` in all: a short epoch ended on the other workers while one's
        ``worker_init_fn`` failed, and its error was never read (torch, whose every worker
        takes its turn, raises it). Nothing waits when every worker is ready (the usual case)."""
        deadline = time.monotonic() + START_WAIT_S
        for w in list(self.pool.workers.values()):
            if (w.ready or w.ring is None or w.retiring or w.external
                    or w.slot in self.pool.failed_slots):
                continue
            try:
                if not w.conn.poll(max(0.0, deadline - time.monotonic())):
                    continue
                msg = w.conn.recv()
            except (EOFError, OSError):
                continue
            self.handle(w, msg)  # an init_error raises Fatal: the training loop gets it
