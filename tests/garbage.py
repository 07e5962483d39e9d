"""A full garbage collection that waits for one another thread is running (the leak checks').

``gc.collect()`` returns at once, collecting nothing, while another thread of the interpreter
collects (CPython runs one collection at a time and skips a second), and that collection's
finalisers may still be running: an epoch iterator's (in a reference cycle, as any held by a
``pytest.raises`` block's frame is) stopping its workers and joining them, in whichever thread
allocated when the collector was due. A leak check that collected and looked again then found
workers a moment from being joined (a full run's "worker processes left behind" at
``test_faults.py``'s worker-death test, reproduced with a thread collecting in a loop).
"""

from __future__ import annotations

import gc
import os
import select
import threading
import time
from typing import Any

UNSEEN_WAIT_S = 0.005
"""Seconds to wait before collecting again where this thread's collection was skipped and no
collection is seen running: one whose start came before the tracking did, or one ending now
(its last callback runs before the interpreter lets another start): a wait, not a spin."""


class Collections:
    """Tracks the interpreter's collections through ``gc.callbacks`` once installed.

    The callback takes no lock: it runs wherever an allocation made the collector due, also
    inside this class's own wait, which would then wait for itself. It sets two attributes
    and writes a byte to a pipe at each collection's end, which the wait selects on. The leak
    checks install one for the whole session (``tests/conftest.py``): its pipe is never closed
    while another thread's collection may still be calling it."""

    def __init__(self) -> None:
        self.running = False
        self._full_in: int | None = None  # thread ident of the last full collection's
        self._pid = os.getpid()
        self._read, self._write = os.pipe()
        for end in (self._read, self._write):
            os.set_blocking(end, False)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if os.getpid() != self._pid:
            return  # a forked child's collections, not this process's
        if phase == "start":
            self.running = True
            if info["generation"] == 2:
                self._full_in = threading.get_ident()
            return
        self.running = False
        try:
            os.write(self._write, b".")
        except OSError:
            pass  # the pipe is full: the wait wakes all the same

    def install(self) -> Collections:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def __enter__(self) -> Collections:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)
        os.close(self._read)
        os.close(self._write)

    def collect(self, timeout_s: float = 30.0) -> None:
        """A full collection in this thread, after the collections other threads run now have
        ended with their finalisers (at most ``timeout_s`` seconds of waiting for them)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._full_in = None
            gc.collect()
            if self._full_in == threading.get_ident() or not self._wait_idle(deadline):
                return

    def _wait_idle(self, deadline: float) -> bool:
        """Wait until no collection runs; False when ``deadline`` (monotonic) came first."""
        while True:
            self._drain()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not self.running:
                select.select([self._read], [], [], min(left, UNSEEN_WAIT_S))
                return True
            select.select([self._read], [], [], left)

    def _drain(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass
