"""The worker pools alive in this process, and what happens to them at a fork and at exit
(see NOTE [headrace shutdown] in ``runtime/worker_stop.py``): the interpreter's exit stops them
(and the scheduler threads of epochs still open), a process forked from this one leaves them
alone, and a new pool finishes the shutdowns an interrupt cut short. Pools are held weakly and
read by their attributes only."""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_exit_lock = threading.Lock()
_schedulers: weakref.WeakSet[Any] = weakref.WeakSet()
"""Epochs' schedulers whose thread was started (``Scheduler.start``), for the exit."""


def running(scheduler: Any) -> None:
    """``scheduler`` (a ``Scheduler``) started its thread: the exit stops it."""
    _schedulers.add(scheduler)


def add(pool: Any) -> None:
    """``pool`` (a ``WorkerPool``) has workers to stop at exit."""
    _live.add(pool)


def discard(pool: Any) -> None:
    """``pool`` stopped every worker."""
    _live.discard(pool)


def pools() -> list[Any]:
    """The pools alive now."""
    return list(_live)


def sweep_interrupted() -> None:
    """Finish the shutdowns an interrupt cut short (a Ctrl-C caught while an epoch closed, as
    a notebook does): their pools are closed, so no epoch's close asks again, and their
    workers stayed until the interpreter exited, more at each such Ctrl-C."""
    for pool in list(_live):
        if pool._undisposed and pool._owner_pid == os.getpid():
            pool.shutdown(grace_s=0.0)


def _forget_workers_in_child() -> None:
    """In a process just forked (``os.fork()`` in the user's code, or a worker being started):
    the live pools' worker processes are not its children. multiprocessing's own exit hook
    terminates every daemon process its ``_children`` holds, and a forked child inherits that
    set: a helper the user's code forked that exited through the interpreter sent SIGTERM to
    the training process's workers (torch's too). They are taken out of it here; the pools'
    own ``shutdown`` does nothing outside the process that made them."""
    import multiprocessing.process as mp_process

    children = getattr(mp_process, "_children", None)
    if not isinstance(children, set):
        return
    for pool in list(_live):
        for h in list(pool.workers.values()) + list(pool._undisposed):
            children.discard(h.process)


os.register_at_fork(after_in_child=_forget_workers_in_child)


@atexit.register
def _shutdown_all() -> None:
    """Interpreter exit: stop the scheduler threads of epochs still open (a script ending
    inside an epoch), then whatever pools are still alive (see NOTE [headrace shutdown]). A
    scheduler thread saw its pool closed and returned, but was not waited for: a daemon thread
    still running when the interpreter finalises is ended wherever it is, inside torch's C++
    code too, where that aborts the process ("terminate called without an active exception",
    exit code 134: seen once, a script ending inside a persistent-workers epoch on a loaded
    machine)."""
    with _exit_lock:
        for scheduler in list(_schedulers):
            scheduler.stop()  # (joins its thread)
        for pool in list(_live):
            pool.shutdown(grace_s=0.2)
