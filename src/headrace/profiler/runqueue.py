"""How long the calling thread has waited for a core: the second field of Linux's
``/proc/thread-self/schedstat`` (nanoseconds spent runnable on a run queue, not running).

A step's wall time includes that wait when more threads want to run than there are cores,
and a step's CPU share measured as ``cpu / wall`` then falls with the load it was measured
under: the imagenet steps read 0.97 with one worker on 2 cores, 0.89 with two and 0.69 with
three. Sizing the worker pool from such a share (``planner/workers.py``) asked for three
workers because two were measured, and a profile stored from three asked for three again.
Waiting for a core is not waiting for I/O: the planner subtracts this wait from wall time.

The file is opened once per thread (again in a forked child) and read with one ``pread``
(about 2 µs). Where the kernel does not say (another OS, schedstats off), the clock reads 0.
"""

from __future__ import annotations

import os
import threading

_local = threading.local()


class _Fd:
    """One thread's open schedstat file (-1: not available); closed when the thread's
    ``threading.local`` storage is freed at its end. ``pid``: the process that opened it (a
    child forked by a thread that had opened one inherits the parent thread's file)."""

    __slots__ = ("fd", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            int(os.pread(self.fd, 128, 0).split()[1])
        except (OSError, ValueError, IndexError):
            self.close()
            self.fd = -1

    def close(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


def run_queue_s() -> float:
    """Seconds the calling thread has spent waiting for a core since it started (monotonic;
    0.0 where the kernel does not say). Subtract two readings for an interval."""
    f = getattr(_local, "f", None)
    if f is None or f.pid != os.getpid():
        f = _local.f = _Fd()
    if f.fd < 0:
        return 0.0
    return int(os.pread(f.fd, 128, 0).split()[1]) / 1e9
