"""What a loader's remote side counts (``RemoteCounts``), and how each remote result counts
once the scheduler takes it (``outcome``, ``Outcomes``). No Ray here."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

OFFLOADED = "offloaded"
"""A sample's remote part is done: finished remotely, or handed back at the split point."""
HANDED_OFF = "handed_off"
"""A remote worker handed the sample off over the timeout, before its split point."""
HANDED_BACK = "handed_back"
"""Near storage: a fetcher handed the sample back at its own stop, for the local workers to
finish (``ProxyOptions.stops``)."""
PENDING_KEPT = 64
"""Results whose outcome a proxy remembers until the scheduler takes them: many more than it
has in flight (``dispatch.DEPTH``, 2); older ones were dropped as stale, and are forgotten."""


def outcome(msg: tuple[Any, ...], stop: int, per_sample: bool = False) -> str | None:
    """How an actor's message for a sample run up to step ``stop`` counts (None: an error,
    not at all). ``per_sample``: ``stop`` is the sample's own (near storage), and one handed
    back there is no offloaded share of a split: it counted in ``remote_samples``, and
    ``explain()`` said such samples "finished remotely"."""
    if msg[0] == "done":
        return OFFLOADED
    if msg[0] == "partial":
        if msg[2] < stop:
            return HANDED_OFF
        return HANDED_BACK if per_sample else OFFLOADED
    return None


class Outcomes:
    """One proxy's results on their way to the scheduler, and how each counts once taken.

    The proxy notes each result's outcome as it posts it (``expect``); the scheduler says which
    results it took (``took``: ``WorkerHandle.took``), and only those count (``count(outcome)``).
    Counted as the proxy posted them, results the scheduler drops as stale counted too: a
    sample whose task moved to an idle worker while queued at the actor
    (``Dispatcher._steal``) ran there all the same and counted twice, and samples an epoch
    ended early left in flight counted though never delivered. A stale result is never taken:
    its note is forgotten once ``PENDING_KEPT`` newer ones wait (memory stays bounded).
    """

    def __init__(self, count: Callable[[str], None]) -> None:
        self._count = count
        self._pending: dict[int, str] = {}  # task id -> outcome, oldest first
        self._lock = threading.Lock()  # the proxy notes, the scheduler (or the proxy) takes

    def expect(self, tid: int, kind: str | None) -> None:
        """(Proxy) the result of task ``tid``, about to be posted, counts as ``kind``."""
        if kind is None:
            return
        with self._lock:
            self._pending[tid] = kind
            while len(self._pending) > PENDING_KEPT:
                del self._pending[next(iter(self._pending))]

    def took(self, tid: int) -> None:
        """(Scheduler) it took the result of task ``tid``: count it."""
        with self._lock:
            kind = self._pending.pop(tid, None)
        if kind is not None:
            self._count(kind)


class RemoteCounts:
    """The numbers of a loader's remote side since the loader started (``RemoteSession``'s
    half that counts; ``explain()`` and the offloading policies read them).

    ``remote_samples``: samples offloaded (their remote part done: finished remotely, or
    handed back at the split point); ``resumed_remote``: slow-lane samples (resumed at a later
    step) sent to remote workers; ``handed_off_remote``: samples remote workers handed off over
    the timeout (finished in the slow lane); ``handed_back_remote``: near storage, samples
    fetchers handed back at their own stop (not in ``remote_samples``); ``lost``: remote
    workers that died after they started (their samples were re-run).
    """

    def __init__(self) -> None:
        self.remote_samples = 0
        self.resumed_remote = 0
        self.handed_off_remote = 0
        self.handed_back_remote = 0
        self.lost = 0
        self._count_lock = threading.Lock()

    def _took(self, kind: str) -> None:
        """The scheduler took a remote worker's result (``Outcomes``)."""
        with self._count_lock:
            if kind == OFFLOADED:
                self.remote_samples += 1
            elif kind == HANDED_OFF:
                self.handed_off_remote += 1
            else:
                self.handed_back_remote += 1

    def _resumed(self) -> None:
        with self._count_lock:
            self.resumed_remote += 1

    def _lost(self) -> None:
        with self._count_lock:
            self.lost += 1
