"""What a loader's remote side counts (``RemoteCounts``), and how each remote result counts
once the scheduler takes it (``outcome``, ``Outcomes``). No Ray here."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from headrace.remote.proxy_options import LOAD_DREW, NOT_LOADED

log = logging.getLogger("headrace")

SampleKey = tuple[int, int, int]
"""One sample of one epoch: (epoch, dataset index, draw) (``runtime.worker.Task``'s fields;
``draw``: the index's earlier draws in the epoch, with a sampler that repeats indices)."""

OFFLOADED = "offloaded"
"""A remote worker finished the sample."""
AT_SPLIT = "at_split"
"""A remote worker handed the sample back at the split point: its remote part is done, and
it counts as offloaded like a finished one. Should a replan move the split later meanwhile,
a remote worker may run the sample's steps up to the new split: that result does not count
it again (``RemoteCounts``)."""
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
        return HANDED_BACK if per_sample else AT_SPLIT
    return None


class Outcomes:
    """One proxy's results on their way to the scheduler, and how each counts once taken.

    The proxy notes each result's outcome as it posts it (``expect``); the scheduler says which
    results it took (``took``: ``WorkerHandle.took``), and only those count
    (``count(outcome, sample)``).
    Counted as the proxy posted them, results the scheduler drops as stale counted too: a
    sample whose task moved to an idle worker while queued at the actor
    (``Dispatcher._steal``) ran there all the same and counted twice, and samples an epoch
    ended early left in flight counted though never delivered. A stale result is never taken:
    its note is forgotten once ``PENDING_KEPT`` newer ones wait (memory stays bounded).
    """

    def __init__(self, count: Callable[[str, SampleKey, bool], None]) -> None:
        self._count = count
        self._pending: dict[int, tuple[str, SampleKey, bool]] = {}  # task id -> (outcome,
        # sample, fresh), oldest first
        self._lock = threading.Lock()  # the proxy notes, the scheduler (or the proxy) takes

    def expect(self, tid: int, kind: str | None, sample: SampleKey, fresh: bool = False) -> None:
        """(Proxy) the result of task ``tid`` (for ``sample``), about to be posted, counts as
        ``kind``; ``fresh``: the task started at step 0 (a local worker would have looked the
        sample up in the cache)."""
        if kind is None:
            return
        with self._lock:
            self._pending[tid] = (kind, sample, fresh)
            while len(self._pending) > PENDING_KEPT:
                del self._pending[next(iter(self._pending))]

    def took(self, tid: int) -> None:
        """(Scheduler) it took the result of task ``tid``: count it."""
        with self._lock:
            noted = self._pending.pop(tid, None)
        if noted is not None:
            self._count(*noted)


class RemoteCounts:
    """The numbers of a loader's remote side since the loader started (``RemoteSession``'s
    half that counts; ``explain()`` and the offloading policies read them).

    ``remote_samples``: samples offloaded (their remote part done: finished remotely, or
    handed back at the split point); ``resumed_remote``: slow-lane samples (resumed at a later
    step) sent to remote workers; ``handed_off_remote``: samples remote workers handed off over
    the timeout (finished in the slow lane); ``handed_back_remote``: near storage, samples
    fetchers handed back at their own stop (not in ``remote_samples``); ``lost``: remote
    workers that died after they started (their samples were re-run); ``uncached``: samples
    remote workers ran from step 0, whatever they returned (finished, handed back or off):
    remote workers have no sample cache, so none of them was looked up there, nor were the
    forms made remotely stored (``docs/design.md``); ``loaded_again``: samples a proxy loaded
    for its actor (``Remote(read_source=False)``) and handed back to the local workers, which
    load them again, because the loaded value would not have arrived as it is
    (``proxy_options.LoadLocally``; not in ``remote_samples``), or because the load drew from
    a global random generator (``load_drew`` of them); ``not_loaded``: samples the proxies
    handed to the local workers without loading them, queued at a proxy when the loads
    stopped (``LoadDraws.stopped``; at most ``dispatch.DEPTH`` per remote worker: none are
    given to them after).

    Each sample counts once in ``remote_samples``. One handed back at the split point
    (``AT_SPLIT``) is remembered while it is in flight: when a replan has moved the split
    later, a remote worker may take it again for the steps up to the new split (it has steps
    left before it: ``ProxyOptions.runs``), and it counted twice. The memory is bounded by the
    samples in flight: those no longer in flight (local workers finished them, or their epoch
    ended) are forgotten (``forget_settled``).
    """

    def __init__(self) -> None:
        self.remote_samples = 0
        self.resumed_remote = 0
        self.handed_off_remote = 0
        self.handed_back_remote = 0
        self.lost = 0
        self.uncached = 0
        self.loaded_again = 0
        self.load_drew = 0
        self.not_loaded = 0
        self._count_lock = threading.Lock()
        self._at_split: set[SampleKey] = set()  # counted at a split, maybe still in flight

    def _took(self, kind: str, sample: SampleKey, fresh: bool = False) -> None:
        """The scheduler took a remote worker's result for ``sample`` (``Outcomes``);
        ``fresh``: its task started at step 0."""
        with self._count_lock:
            self.uncached += fresh
            if kind == HANDED_OFF:
                self.handed_off_remote += 1
            elif kind == HANDED_BACK:
                self.handed_back_remote += 1
            elif sample in self._at_split:  # counted when handed back at an earlier split
                if kind == OFFLOADED:
                    self._at_split.discard(sample)
            else:
                self.remote_samples += 1
                if kind == AT_SPLIT:
                    self._at_split.add(sample)

    def forget_settled(self, recs: dict[int, Any]) -> None:
        """(Scheduler, every pass, under its lock) Forget the samples counted at a split that
        are no longer among ``recs`` (the running epoch's samples in flight,
        ``runtime.work.Rec`` by task id). Only once they outnumber twice those in flight (plus
        16): each remembered sample costs O(1) on average."""
        if len(self._at_split) <= 2 * len(recs) + 16:
            return
        live = {(r.task.epoch, r.task.sample, r.task.draw) for r in recs.values()}
        with self._count_lock:
            self._at_split &= live

    def _resumed(self) -> None:
        with self._count_lock:
            self.resumed_remote += 1

    def _loaded_again(self, why: str) -> None:
        """A proxy handed a sample back to the local workers because of ``why``
        (``runtime/faithful.py``'s reason, ``LOAD_DREW``, or ``NOT_LOADED``: it did not load
        it); the first one of the loader is said in a warning (the loads stopping, by
        ``LoadDraws``)."""
        with self._count_lock:
            if why == NOT_LOADED:
                self.not_loaded += 1
                first = False
            else:
                self.loaded_again += 1
                self.load_drew += why == LOAD_DREW
                first = self.loaded_again == 1
        if first:
            log.warning("headrace: a sample loaded for a remote worker (Remote(read_source="
                        "False)) was not sent to it: %s. A local worker loads it again and runs "
                        "it whole, as without remote workers; every such sample is loaded "
                        "twice (said once per loader; counted in loader.remote.loaded_again; "
                        "docs/design.md, \"What cannot be handed off\")", why)

    def _lost(self) -> None:
        with self._count_lock:
            self.lost += 1
