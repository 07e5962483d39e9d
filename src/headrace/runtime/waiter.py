"""What the scheduler thread waits on, between two passes over its work, and for how long
(``POLL_S``, ``next_poll_s``).

Worker result pipes and process sentinels (a message, or a death), a wake-up pipe (work to
dispatch: room freed by the training loop, a worker added), and task pipes still full (rare: a
large hand-off payload; watched until they drain). One persistent selector (epoll): building a
selector per wait cost more CPU than the rest of the scheduler. Waits at most the caller's
timeout, so the scheduler sees its stop event (NOTE [headrace shutdown] in ``runtime/worker_stop.py``).

The training thread wakes the scheduler on its way out of ``next()`` (room freed). The pipe
write releases the GIL, the woken thread takes it for its pass, and ``next()`` waited for that
pass to end with its batch in hand: 0.2-0.45 ms a batch, a third to a half of the time imseg's
training loop spent inside ``next()`` on 2 cores. So a wake-up sent on the way out
(``leaving=True``) makes the woken thread first give the GIL back, in short sleeps, until the
training thread says it left (:meth:`Waiter.left`) or ``GIVE_WAY_MAX_S`` passed; its pass then
runs while the training loop computes (and releases the GIL in its own calls), as it would
have anyway. Short sleeps rather than an event: woken by an event the moment ``left`` is
called, the scheduler thread took the GIL before ``next()`` had returned (imseg spent 47-92 ms
an epoch there, against 14-24 ms with the sleeps, whose window lets the training loop get on
with its step).
"""

from __future__ import annotations

import os
import selectors
import time
from typing import Any

from headrace.runtime.handles import WorkerHandle

POLL_S = 0.05
"""Longest the scheduler thread blocks before re-checking its stop event (seconds)."""
IDLE_POLL_S = 1.0
"""...doubled up to this while no worker holds a task and nothing happens (seconds): an
iterator abandoned mid-epoch but still referenced (a kept traceback, a notebook's variable)
ticked 20 times a second, about 1% of a core each, where torch's sits idle. Anything that can
give it work wakes it at once (a batch taken, a worker ready or added, stop)."""


def next_poll_s(poll_s: float, idle: bool) -> float:
    """The next wait's bound (seconds) after a wait of ``poll_s``: doubled up to
    ``IDLE_POLL_S`` when it passed with nothing assigned and nothing happening, else
    ``POLL_S``."""
    return min(2 * poll_s, IDLE_POLL_S) if idle else POLL_S


GIVE_WAY_S = 20e-6
"""One sleep of the woken scheduler thread while the training thread leaves ``next()``
(seconds; Linux adds its timer slack, 50 µs by default)."""
GIVE_WAY_MAX_S = 0.002
"""Longest the woken scheduler thread gives way before its pass (seconds): the training thread
may be off its core, and the pass must not wait on it for long."""


class Waiter:
    def __init__(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._watched: dict[int, tuple[WorkerHandle, int, int]] = {}  # slot -> (w, pipe, sentinel)
        self._leaving = False  # the training thread woke us on its way out of next()

    @property
    def wake_fd(self) -> int:
        """Read end of the wake-up pipe (−1 once closed)."""
        return self._wake_r

    @property
    def closed(self) -> bool:
        return self._wake_r < 0

    def wake(self, leaving: bool = False) -> None:
        """A byte on the wake-up pipe: the next (or current) wait returns. ``leaving``: from
        the training thread on its way out of ``next()``, which calls :meth:`left` once out;
        the wait gives way to it first (module docstring)."""
        fd = self._wake_w
        if fd < 0:
            return  # closed: the descriptor number may be reused by now
        if leaving:
            self._leaving = True
        try:
            os.write(fd, b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is already pending

    def left(self) -> None:
        """The training thread is out of ``next()`` (or about to return from it)."""
        self._leaving = False

    def sync(self, workers: dict[int, WorkerHandle]) -> list[WorkerHandle]:
        """Watch exactly ``workers`` (slot -> handle); returns the ones newly watched."""
        for slot, (w, _, _) in list(self._watched.items()):
            if workers.get(slot) is not w:
                self.unwatch(w)
        added = []
        for slot, w in workers.items():
            if slot not in self._watched:
                conn_fd, sentinel = w.conn.fileno(), w.sentinel
                self._sel.register(conn_fd, selectors.EVENT_READ, ("conn", w))
                self._sel.register(sentinel, selectors.EVENT_READ, ("sentinel", w))
                self._watched[slot] = (w, conn_fd, sentinel)
                added.append(w)
        return added

    def unwatch(self, w: WorkerHandle) -> None:
        """Forget a worker's descriptors; call before the pool closes them (numbers get reused)."""
        entry = self._watched.get(w.slot)
        if entry is None or entry[0] is not w:
            return
        del self._watched[w.slot]
        for fd in entry[1:]:
            try:
                self._sel.unregister(fd)
            except (KeyError, ValueError, OSError):
                pass

    def wait(self, workers: list[WorkerHandle], timeout_s: float) -> list[tuple[str, Any]]:
        """Block up to ``timeout_s`` seconds; returns ``("conn", w)`` for a result pipe with a
        message (or at EOF) and ``("sentinel", w)`` for a worker that may have died. Flushes
        full task pipes of ``workers`` first and watches those still full."""
        full = [w for w in workers if w.tasks.pending and not w.tasks.flush()]
        for w in full:
            self._sel.register(w.tasks.fileno(), selectors.EVENT_WRITE, ("drained", w))
        try:
            events = self._sel.select(timeout=timeout_s)
        finally:
            for w in full:
                self._sel.unregister(w.tasks.fileno())
        out = []
        for key, _ in events:
            what, w = key.data
            if what == "wake":
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
            elif what != "drained":
                out.append((what, w))
        if self._leaving:
            self._give_way()
        return out

    def _give_way(self) -> None:
        """Sleep (the GIL released) until the training thread left ``next()``, at most
        ``GIVE_WAY_MAX_S``, after which the flag is forgotten: a training thread that never
        says it left costs one such wait, not one per wake-up. (Cleared here only then: a
        clear after the loop could erase the next ``mark``'s flag, set meanwhile.)"""
        deadline = time.monotonic() + GIVE_WAY_MAX_S
        while self._leaving:
            if time.monotonic() >= deadline:
                self._leaving = False
                break
            time.sleep(GIVE_WAY_S)

    def close(self) -> None:
        """Close the pipes and the selector (idempotent)."""
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        self._sel.close()
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
