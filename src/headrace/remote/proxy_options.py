"""What every proxy thread of one pool shares (``ProxyOptions``): the pipeline its actor runs,
where the remote part of a sample ends, and the session's callbacks; how a proxy's results
count once the scheduler takes them (``Outcomes``). No Ray here: the proxies themselves are
``remote/ray_backend.py``'s."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from headrace.remote.config import Remote
from headrace.runtime.worker import Task


class ProxyOptions:
    """What every proxy of one pool shares (set by ``remote/session.py``).

    ``pipeline``: what every actor runs, passed to each actor's constructor by value (NOTE [no
    driver-owned objects]). ``stop``: the step the remote part ends at (the offload split
    point; the pipeline's step count: the whole sample). ``processes``: the local workers are processes, so partial values
    they exchange are ``runtime/transport.py``-encoded. ``on_lost()``: an actor died after
    it started; ``on_resumed()``: a sample resumed at a later step was sent;
    ``on_started(slot)``: an actor runs; ``on_start_failed(slot, cause)``: an actor died before
    it ran (``cause``: ``remote/starts.py``'s ``start_cause``).
    """

    def __init__(self, cfg: Remote, pipeline: Any, steps: int, processes: bool,
                 on_lost: Callable[[], None] | None = None,
                 on_resumed: Callable[[], None] | None = None,
                 on_started: Callable[[int], None] | None = None,
                 on_start_failed: Callable[[int, str], None] | None = None) -> None:
        self.cfg = cfg
        self.pipeline = pipeline
        self.steps = steps
        self.stop = steps
        self.read_local = not cfg.read_source
        self.processes = processes
        self.on_lost = on_lost
        self.on_resumed = on_resumed
        self.on_started = on_started
        self.on_start_failed = on_start_failed
        self.handoff: Any = None
        """The pool's ``HandOff`` (timeout, typical seconds left per step), sent with each
        task that may be handed off (None: remote workers never hand samples off)."""
        self.placed: dict[int, str] = {}
        """Slot -> Ray node id of the running remote worker in it (removed when it ends)."""
        self.stops: Any = None
        """Per-sample split (near storage: ``stops[sample]``, ``remote/storage.py``; None:
        ``stop`` for every sample)."""

    def stop_for(self, sample: int) -> int:
        """Where the remote part of ``sample`` ends."""
        return self.stop if self.stops is None else int(self.stops[sample])

    def runs(self, task: Task) -> bool:
        """Whether a remote worker may take ``task`` (a retry, a slow-lane sample): it has steps
        left before its split point. One handed back at the split is the local workers' to
        finish (``WorkerHandle.runs``)."""
        return task.start < self.stop_for(task.sample)


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
