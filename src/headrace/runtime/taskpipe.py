"""The training process's end of a worker's task pipe: sends that never block.

A ``multiprocessing.Queue`` per worker (the first design) hands every ``put`` to a feeder
thread, which must wake up and take the GIL to pickle and write: two thread switches per task
inside the training process, on the path between a worker finishing a sample and receiving the
next one (on imagenet-like samples of ~5 ms, a third of the scheduler thread's wall time).

A plain pipe is written directly by the scheduler thread. A blocking write could deadlock: the
pipe is full (a large hand-off payload, the worker busy) while the worker blocks writing its
result to the scheduler. So the pipe is non-blocking; bytes that do not fit wait in an outbox
that :meth:`TaskPipe.flush` writes once the pipe has room (the scheduler watches
:meth:`TaskPipe.fileno` for writability while :attr:`TaskPipe.pending`). Frames are ``multiprocessing.connection`` frames, so the worker reads
with ``Connection.recv``; objects are pickled by multiprocessing's ``ForkingPickler`` (torch
registers its shared-memory reductions there), as ``Connection.send`` does.
"""

from __future__ import annotations

import os
import struct
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any


class TaskPipe:
    """Non-blocking, framed writes to the write end ``conn`` of a ``multiprocessing.Pipe``."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn  # kept: closing it closes the descriptor
        self._fd = conn.fileno()
        os.set_blocking(self._fd, False)
        self._out = bytearray()
        self._lock = threading.Lock()  # the scheduler thread sends; shutdown may, from another

    def fileno(self) -> int:
        """The pipe's write end, to wait until it has room again (``select`` for writing)."""
        return self._fd

    @property
    def pending(self) -> bool:
        """Bytes wait in the outbox (the pipe was full)."""
        return bool(self._out)

    def send(self, obj: Any) -> None:
        """Queue ``obj`` for the worker and write what the pipe takes now.

        Raises:
            OSError: the pipe is closed or broken (the worker is gone).
        """
        data = bytes(ForkingPickler.dumps(obj))
        n = len(data)
        header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
        with self._lock:
            self._out += header
            self._out += data
            self._flush_locked()

    def flush(self) -> bool:
        """Write what the pipe takes now; True when nothing is left waiting.

        Never raises: if the worker is gone, what waited is dropped (its death is handled by
        its sentinel, and the tasks it held are re-run from the scheduler's records).
        """
        with self._lock:
            try:
                return self._flush_locked()
            except OSError:
                return True

    def _flush_locked(self) -> bool:
        while self._out:
            try:
                written = os.write(self._fd, self._out)
            except BlockingIOError:
                return False
            except OSError:
                self._out.clear()  # broken pipe: nobody will read these bytes
                raise
            del self._out[:written]
        return True

    def close(self) -> None:
        with self._lock:
            self._out.clear()
            self._conn.close()
