"""Remote workers that never started: the cause, in words, and when to stop starting more.

A Ray actor whose constructor raises (most often: a step's module importable on the training
host but not on the remote nodes, so unpickling the pipeline fails there) dies before it runs a
sample. Replacing it as if it had been lost would start one more every ``replacing.REPLACE_EVERY_S`` for
ever, each failing the same way, and say nothing of why. So would replacing one that Ray placed
and that then ended before returning a single sample (a step that ends its process on the Ray
nodes: a native library broken there, a memory limit): such an end counts as a start that
failed too, though the samples it held are re-run as a lost worker's. Plain data, no Ray: the
proxy threads (``remote/ray_backend.py``) report each start that failed, each actor placed and
each first result, and ``remote/session.py`` asks whether to start another.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

from headrace.remote.counts import Outcomes, SampleKey

log = logging.getLogger("headrace")

MAX_START_FAILURES = 3
"""Remote workers that failed to start in a row (none returned a sample in between: died in
their constructor, or ended before their first result) after which no more are started: the loader goes on with the local workers (``Remote(required=False)``) or fails
naming the cause (``required=True``)."""
ENDED_FIRST = ("it ended before returning its first sample, after Ray placed it (its process "
               "or node died, or its proxy failed: the warning 'headrace remote worker N lost' "
               "has Ray's words; a step that ends the process on the Ray nodes, a native crash "
               "or a memory limit there, is the usual cause)")
"""The cause of a remote worker that ended before its first result (``StartFailures.lost``)."""
TRACEBACK_LINES = 4
"""Lines of the remote traceback's end kept in the cause (the raising frame and the error)."""

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def start_cause(error_type: str, text: str) -> str:
    """Why an actor did not start, in a few lines: the remote exception's last line (its type
    and message), where it was raised, then the end of the remote traceback when it has frames.
    ``error_type``: the type Ray raised in the training process (``ActorDiedError``); ``text``:
    its message, which holds the remote traceback when the constructor, or the unpickling of
    its arguments, raised."""
    lines = [ln.rstrip() for ln in _ANSI.sub("", text).splitlines()]
    lines = [ln for ln in lines if ln.strip() and set(ln.strip()) - set("^~")]  # no markers
    tb = next((i for i in range(len(lines) - 1, -1, -1)
               if "Traceback (most recent call last)" in lines[i]), None)
    if tb is None:  # no remote traceback (a node that died, a placement that failed)
        if not lines:
            return f"{error_type} (no message)"
        return f"{error_type}: {lines[0]}" + (f" ({lines[-1].strip()})" if len(lines) > 1 else "")
    body = lines[tb + 1:]
    last = next((ln for ln in reversed(body) if not ln[0].isspace()), None)
    if last is None:
        last = body[-1].strip() if body else error_type
    frames = [ln for ln in body if ln is not last]
    where = ("while unpickling the pipeline it was given"
             if any("input arguments" in ln for ln in lines[:tb]) else "in its constructor")
    out = f"{last} (raised on the remote worker's node {where})"
    if frames:
        out += "\n  remote traceback ends:\n" + "\n".join(
            "    " + ln.strip() for ln in frames[-TRACEBACK_LINES:])
    return out


class StartFailures:
    """Starts that failed, in all and in a row, and the first cause of the failures in a row
    (thread-safe: proxy threads report, the scheduler thread asks).

    A start succeeds at the worker's first result (``returned``), not when Ray places its
    actor (``placed``): an actor placed and then lost before any result (``lost``) failed to
    start as surely as one whose constructor raised. Counting it as started once placed
    reset the count at every replacement, and a failure that hits every remote worker after
    placement was replaced once a second for ever."""

    def __init__(self, limit: int = MAX_START_FAILURES) -> None:
        self.limit = limit
        self.total = 0
        """Remote workers that never started (died before Ray ran them)."""
        self.ended_first = 0
        """Remote workers Ray placed that ended before returning a sample (counted lost too)."""
        self._unproven: set[int] = set()  # slots whose placed actor has returned nothing yet
        self.in_a_row = 0
        self.cause: str | None = None
        """Why the first of the failures in a row did not start (None: none failed since the
        last start). It used to be the latest cause whenever that differed, and stayed after
        a start: ``explain()`` went on saying remote workers could not start."""
        self._last: str | None = None  # the latest cause, reported once (not at each repeat)
        self._lock = threading.Lock()

    @property
    def gave_up(self) -> bool:
        """``limit`` starts failed in a row: start no more."""
        return self.in_a_row >= self.limit

    def failed(self, cause: str, placed: bool = False) -> tuple[bool, bool]:
        """One more start failed (``placed``: after Ray placed it, before its first result);
        (report it: a new cause, this one made it give up)."""
        with self._lock:
            new, self._last = cause != self._last, cause
            if self.in_a_row == 0:
                self.cause = cause
            if placed:
                self.ended_first += 1
            else:
                self.total += 1
            self.in_a_row += 1
            return new, self.in_a_row == self.limit

    def report(self, slot: int, cause: str, address: str, required: bool,
               placed: bool = False) -> bool:
        """``failed``, and its warnings: the cause when new, then giving up. True: it gave up
        now (``required``: the caller ends the epoch with ``message``)."""
        new, gave_up = self.failed(cause, placed)
        if new:
            log.warning("headrace remote worker %d could not start on the Ray cluster %r: %s",
                        slot, address, cause)
        if gave_up:
            log.warning("%s", self.message(address, required))
        return gave_up

    def placed(self, slot: int) -> None:
        """(Proxy) Ray placed the actor of ``slot`` and it runs; it has started once it
        returns a result (``returned``)."""
        with self._lock:
            self._unproven.add(slot)

    def returned(self, slot: int) -> None:
        """(Proxy) the worker in ``slot`` returned a result: it has started, and any result
        ends the failures in a row, as a start did (remote workers run somewhere; a sample
        that kills whichever worker runs it, new ones included, is the error policy's to
        bound: ``max_worker_restarts``). Most calls cost two reads, no lock."""
        if self.in_a_row or slot in self._unproven:
            with self._lock:
                self._unproven.discard(slot)
            self.started()

    def lost(self, slot: int) -> bool:
        """(Proxy) the worker in ``slot``, placed, was lost: True when it had returned nothing
        (the caller reports it as a start that failed, ``ENDED_FIRST``)."""
        with self._lock:
            if slot not in self._unproven:
                return False
            self._unproven.discard(slot)
            return True

    def started(self) -> None:
        """A remote worker started: the failures before it are not in a row any more."""
        with self._lock:
            self.in_a_row, self.cause = 0, None

    def message(self, address: str, required: bool = True) -> str:
        """Why no more remote workers are started (once ``gave_up``), and how to fix it."""
        return (f"headrace's remote workers could not start on the Ray cluster {address!r}: "
                f"{self.limit} in a row ended before returning a sample, the first with "
                f"{self.cause}. A step's module that the Ray nodes cannot import, or a step that "
                "crashes there, is the usual cause: install it there, or connect first with ray.init(runtime_env={'py_modules': [...]}) "
                "(headrace uses that connection)" + (
                    "; or Remote(required=False) to run on local workers only" if required
                    else "; running on local workers only (Remote(required=False))"))


class FirstResult(Outcomes):
    """One proxy's ``Outcomes`` that also tell ``starts`` when the worker in ``slot`` returns
    a result (``StartFailures.returned``): the proxy notes every result of its actor here."""

    def __init__(self, count: Callable[[str, SampleKey, bool], None], slot: int,
                 starts: StartFailures) -> None:
        super().__init__(count)
        self._slot, self._starts = slot, starts

    def expect(self, tid: int, kind: str | None, sample: SampleKey, fresh: bool = False) -> None:
        """(Proxy) as ``Outcomes.expect``, for a result the actor returned."""
        self._starts.returned(self._slot)
        super().expect(tid, kind, sample, fresh)
