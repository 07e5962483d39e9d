"""When a loader replaces a remote worker that ended (its actor lost, its proxy failed, or it
never started): one replacement per such end, at most one every ``REPLACE_EVERY_S``, and only
once the scheduler has handled the end. Plain data, no Ray: proxy threads report ends, the
scheduler thread asks (``remote/session.py``)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

REPLACE_EVERY_S = 1.0
"""Seconds between two replacements of remote workers that ended."""


class Replacements:
    """Ends of remote workers answered so far, and the slots of those whose end the scheduler
    has not handled yet.

    A proxy reports its worker's end (``ended``) from its own thread, before that thread
    returns: the scheduler handles the end (re-runs its samples, frees its slot) only later,
    when the thread's sentinel fires. Asked in between, the session counted the ended worker
    as still running, found no replacement needed, and answered that end for good: the pool
    ran one remote worker short for the rest of its life (seen once in three runs of
    ``tests/ray_cluster/test_proxy_failure.py``). An end is now answered only once its
    worker has left the pool."""

    def __init__(self, every_s: float = REPLACE_EVERY_S) -> None:
        self.every_s = every_s
        self.answered = 0
        """Ends answered by a replacement, or found not to need one (the target went down)."""
        self._at = float("-inf")  # time.monotonic() of the last answer (seconds)
        self._ended: set[int] = set()  # slots whose worker ended, until one starts there
        self._lock = threading.Lock()

    def ended(self, slot: int) -> None:
        """(Proxy) the remote worker in ``slot`` ended (lost, or its start failed)."""
        with self._lock:
            self._ended.add(slot)

    def started(self, slot: int) -> None:
        """A new remote worker is starting in ``slot``: the end there is past."""
        with self._lock:
            self._ended.discard(slot)

    def due(self, ends: int, slots: Iterable[int], now: float) -> bool:
        """(Scheduler) Answer one more end now? ``ends``: remote workers that ended since the
        loader started (lost and never started); ``slots``: those of the pool's remote
        workers; ``now``: ``time.monotonic()``. No while one of them is a worker that ended
        (its end not handled yet: its slot is not free), nor within ``every_s`` of the last
        answer; a yes counts as answered, whether or not a worker is then started."""
        if self.answered >= ends or now - self._at < self.every_s:
            return False
        with self._lock:
            if any(s in self._ended for s in slots):
                return False
        self._at = now
        self.answered += 1
        return True
