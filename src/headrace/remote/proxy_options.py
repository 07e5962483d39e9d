"""What every proxy thread of one pool shares (``ProxyOptions``): the pipeline its actor runs,
where the remote part of a sample ends, and the session's callbacks (how a proxy's results
count: ``remote/counts.py``). No Ray here: the proxies themselves are
``remote/ray_backend.py``'s."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from headrace.remote.config import Remote
from headrace.runtime.worker import Task

log = logging.getLogger("headrace")

LOAD_DREW = ("its load drew from a global random generator (Python's random, numpy.random or "
             "torch's default one), which the training process, where it ran, does not seed "
             "per sample")
"""Why a proxy hands back a sample whose load it saw draw (``LoadLocally.why``)."""
NOT_LOADED = ("the proxies load no more samples: their loads drew from a global random "
              "generator")
"""Why a proxy hands back a sample it did not load (``LoadDraws.stopped``): one queued at it
when the loads stopped."""
DRAWN_IN_A_ROW = 16
"""Loads seen drawing one after another (all proxies of a loader, across its pools) after which
its proxies load no more samples (``LoadDraws.loaded``). Not 1: a draw the training loop makes in its own thread
while a proxy loads looks the same (and costs that sample a second load only). A thread loading
back to back saw 8.5% of its loads "draw" beside a loop drawing once per 20 ms step, 26%
(at most 4 in a row) beside CPU training with dropout: 16 in a row at 26% is about 1 in 10^10
loads. A load that always draws costs 16 samples a second load, and the training loop's
generators 16 loads' draws, once per loader (docs/design.md, "A proxy's load that draws from a
global generator")."""


class LoadDraws:
    """The proxies' loads seen drawing from a global generator, in a row, over a loader's life
    (``RemoteSession`` holds one; every pool's ``ProxyOptions`` shares it), and whether they
    stopped loading (``stopped``). For the loader's life, not a pool's: a pool per epoch
    (non-persistent workers) paid ``DRAWN_IN_A_ROW`` loads drawn and loaded again, and the
    training loop's generators as many draws, every epoch."""

    def __init__(self) -> None:
        self.stopped = False
        """The proxies load no sample (``Remote(read_source=False)``): ``DRAWN_IN_A_ROW``
        loads in a row drew from a global generator. Remote workers then take no sample
        whose remote part starts at the load (``RemoteSession``'s dispatch gate); one queued
        at a proxy when it stopped goes back to the local workers unloaded (``NOT_LOADED``).
        Not set from ``runtime/python_draws.py``'s flags: they say the load drew for some
        sample, maybe one in many, whose load alone the watch sends back."""
        self._in_a_row = 0
        self._lock = threading.Lock()  # every proxy thread reports its loads

    def loaded(self, drew: bool) -> None:
        """(Proxy) a load drew from a global generator (``draw_marks.load_mark`` changed around
        it), or not; ``DRAWN_IN_A_ROW`` drawing loads in a row stop the loads (said once, in
        a warning)."""
        with self._lock:
            if self.stopped:
                return
            self._in_a_row = self._in_a_row + 1 if drew else 0
            self.stopped = self._in_a_row >= DRAWN_IN_A_ROW
            now = self.stopped
        if now:
            log.warning("headrace: the remote workers' proxies (Remote(read_source=False)) load "
                        "no more samples: %d of their loads in a row drew from a global random "
                        "generator. For the rest of this loader, remote workers take no sample "
                        "that starts at the load: the local workers load and run them (said "
                        "once per loader; docs/design.md, \"A proxy's load that draws\")",
                        DRAWN_IN_A_ROW)


class LoadLocally(NamedTuple):
    """The payload of a sample a proxy hands back at step 0 (a task's payload is otherwise
    unused there): the value it loaded for the actor would not have arrived as it is
    (``why``: ``runtime/faithful.py``). The scheduler puts it in the slow lane at step 0; only
    local workers take it (``ProxyOptions.runs``), and one of them loads it again and runs it
    whole, as without remote workers. It never goes back to a proxy, so it cannot loop."""

    why: str
    """``runtime/faithful.py``'s reason, ``LOAD_DREW`` or ``NOT_LOADED``."""


class ProxyOptions:
    """What every proxy of one pool shares (set by ``remote/session.py``).

    ``pipeline``: what every actor runs, passed to each actor's constructor by value (NOTE [no
    driver-owned objects]). ``stop``: the step the remote part ends at (the offload split
    point; the pipeline's step count: the whole sample). ``processes``: the local workers are processes, so partial values
    they exchange are ``runtime/transport.py``-encoded. ``on_lost(slot)``: the worker in ``slot``
    was lost after it started (its actor died, or the proxy itself failed); ``on_resumed()``: a sample resumed at a later step was sent;
    ``on_started(slot)``: an actor runs; ``on_start_failed(slot, cause)``: an actor died before
    it ran (``cause``: ``remote/starts.py``'s ``start_cause``); ``on_loaded_again(why)``: a
    sample loaded here, or taken with ``loads_stopped``, was handed back to the local workers
    (``LoadLocally``).
    """

    def __init__(self, cfg: Remote, pipeline: Any, steps: int, processes: bool,
                 on_lost: Callable[[int], None] | None = None,
                 on_resumed: Callable[[], None] | None = None,
                 on_started: Callable[[int], None] | None = None,
                 on_start_failed: Callable[[int, str], None] | None = None,
                 on_loaded_again: Callable[[str], None] | None = None,
                 draws: LoadDraws | None = None) -> None:
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
        self.on_loaded_again = on_loaded_again
        self.handoff: Any = None
        """The pool's ``HandOff`` (timeout, typical seconds left per step), sent with each
        task that may be handed off (None: remote workers never hand samples off)."""
        self.placed: dict[int, str] = {}
        """Slot -> Ray node id of the running remote worker in it (removed when it ends)."""
        self.stops: Any = None
        """Per-sample split (near storage: ``stops[sample]``, ``remote/storage.py``; None:
        ``stop`` for every sample)."""
        self.draws = draws if draws is not None else LoadDraws()
        """The loader's watch over its proxies' loads (the session's, shared by its pools)."""

    @property
    def loads_stopped(self) -> bool:
        """The proxies load no more samples (``LoadDraws.stopped``)."""
        return self.draws.stopped

    def hand_back(self, task: Task, why: str) -> tuple[Any, ...]:
        """(Proxy) The message that gives ``task`` back at step 0, for a local worker to load
        and run whole (``LoadLocally``), counted (``on_loaded_again``)."""
        if self.on_loaded_again is not None:
            self.on_loaded_again(why)
        return ("msg", ("partial", task.tid, 0, LoadLocally(why), [], 0, None, None))

    def stop_for(self, sample: int) -> int:
        """Where the remote part of ``sample`` ends."""
        return self.stop if self.stops is None else int(self.stops[sample])

    def runs(self, task: Task) -> bool:
        """Whether a remote worker may take ``task`` (a retry, a slow-lane sample): it has steps
        left before its split point. One handed back at the split is the local workers' to
        finish (``WorkerHandle.runs``), and so is one a proxy handed back at step 0 because
        its loaded value could not be shipped (``LoadLocally``)."""
        if isinstance(task.payload, LoadLocally):
            return False
        return task.start < self.stop_for(task.sample)

