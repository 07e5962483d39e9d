"""Daemon threads that run the calls submitted to them: the collate threads of a user
``collate_fn`` (``runtime/output.py``).

``concurrent.futures.ThreadPoolExecutor``'s threads are joined when the interpreter exits, so a
script that left its training loop while a ``collate_fn`` call ran could not exit before that
call returned, and never where it blocked (torch runs ``collate_fn`` in its workers, which are
terminated: a bug hunt saw torch's script exit in 12 s and headrace's still running after 30).
These threads are daemons, as torch's pin-memory thread is: the process exits without them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class DaemonPool:
    """``threads`` daemon threads named ``name_<i>`` running submitted calls in order of
    submission; each call's :class:`~concurrent.futures.Future` holds its result or error."""

    def __init__(self, threads: int, name: str) -> None:
        if threads < 1:
            raise ValueError(f"a pool needs at least one thread, got {threads}")
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue())
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((future, call))
        return future

    def shutdown(self) -> None:
        """Cancel the calls not yet started and end the threads once those running return
        (never waits for them)."""
        while True:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._calls.put(None)

    def _serve(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            future, call = item
            del item
            if future.set_running_or_notify_cancel():
                try:
                    result = call()
                except BaseException as e:  # noqa: BLE001 - the future carries it, as an executor's
                    future.set_exception(e)
                else:
                    future.set_result(result)
                    del result  # a batch is not kept alive by this thread until the next call
            del future, call
