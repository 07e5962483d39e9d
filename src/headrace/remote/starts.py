"""Remote workers that never started: the cause, in words, and when to stop starting more.

A Ray actor whose constructor raises (most often: a step's module importable on the training
host but not on the remote nodes, so unpickling the pipeline fails there) dies before it runs a
sample. Replacing it as if it had been lost would start one more every ``replacing.REPLACE_EVERY_S`` for
ever, each failing the same way, and say nothing of why. Plain data, no Ray: the proxy threads
(``remote/ray_backend.py``) report each start that failed, and ``remote/session.py`` asks
whether to start another.
"""

from __future__ import annotations

import logging
import re
import threading

log = logging.getLogger("headrace")

MAX_START_FAILURES = 3
"""Remote workers that failed to start in a row (none started in between) after which no more
are started: the loader goes on with the local workers (``Remote(required=False)``) or fails
naming the cause (``required=True``)."""
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
    (thread-safe: proxy threads report, the scheduler thread asks)."""

    def __init__(self, limit: int = MAX_START_FAILURES) -> None:
        self.limit = limit
        self.total = 0
        """Remote workers that never started."""
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

    def failed(self, cause: str) -> tuple[bool, bool]:
        """One more start failed; (report it: a new cause, this one made it give up)."""
        with self._lock:
            new, self._last = cause != self._last, cause
            if self.in_a_row == 0:
                self.cause = cause
            self.total += 1
            self.in_a_row += 1
            return new, self.in_a_row == self.limit

    def report(self, slot: int, cause: str, address: str, required: bool) -> bool:
        """``failed``, and its warnings: the cause when new, then giving up. True: it gave up
        now (``required``: the caller ends the epoch with ``message``)."""
        new, gave_up = self.failed(cause)
        if new:
            log.warning("headrace remote worker %d could not start on the Ray cluster %r: %s",
                        slot, address, cause)
        if gave_up:
            log.warning("%s", self.message(address, required))
        return gave_up

    def started(self) -> None:
        """A remote worker started: the failures before it are not in a row any more."""
        with self._lock:
            self.in_a_row, self.cause = 0, None

    def message(self, address: str, required: bool = True) -> str:
        """Why no more remote workers are started (once ``gave_up``), and how to fix it."""
        return (f"headrace's remote workers could not start on the Ray cluster {address!r}: "
                f"{self.limit} in a row died before running a sample, with {self.cause}. A "
                "step's module that the Ray nodes cannot import is the usual cause: install it "
                "there, or connect first with ray.init(runtime_env={'py_modules': [...]}) "
                "(headrace uses that connection)" + (
                    "; or Remote(required=False) to run on local workers only" if required
                    else "; running on local workers only (Remote(required=False))"))
