"""Stopping a pool's workers (``WorkerPool.shutdown``, ``runtime/pool.py``).

NOTE [headrace shutdown]
------------------------
Written once here; every loop that blocks points to it.

* Every blocking call polls: workers wait on their task pipe for at most ``worker.POLL_S`` and
  exit when their parent is gone (the training process was SIGKILLed); the scheduler thread
  waits on result pipes, process sentinels and its wake-up pipe for at most ``waiter.POLL_S``
  and exits when its stop event is set.
* ``WorkerPool.shutdown()`` is idempotent. It sends ``None`` to every task pipe (and closes a
  worker thread's queue, so it exits after the sample it runs), gives workers
  ``grace_s`` to exit on their own, then terminates and finally kills the rest, joins them, and
  closes every pipe and queue (called in one of its own worker threads, which happens when the
  garbage collector finalises an epoch there, it waits for no worker). Samples still in flight
  are discarded: they were never delivered, so nothing is lost (resume re-runs them) and
  nothing is duplicated. A running epoch's scheduler that sees workers exit once the pool
  is closed does not count them as deaths (no warning, nothing queued to re-run).
* Who calls it: the epoch iterator when the epoch ends (unless ``persistent_workers``), when it
  is garbage-collected (``break`` out of the loop, an exception in the training loop: a
  sample's error is raised once the thread that queued it let go of it,
  ``Scheduler.let_go``, so the training thread finalises the epoch), the loader
  when it is deleted, and an ``atexit`` hook holding weak references at interpreter exit
  (``runtime/live_pools.py``, which first stops and joins the scheduler threads of epochs
  still open, and also finishes at the next pool's start a shutdown an interrupt cut short). Workers are daemonic, so even a missed call cannot outlive the
  interpreter. Only the process that made a pool stops it: a process the user's code forks
  runs the exit hook and the finalisers too.
* Starting: a worker is recorded in ``workers`` in the same ``try`` as its fork, which kills
  and reaps it on any exception in between (a Ctrl-C lands where a function starts): unrecorded,
  no shutdown saw it, and it waited on its task pipe until the interpreter exited. A fork cut
  inside ``multiprocessing`` keeps no pid to kill: that child closes its copies of our pipe
  ends (``forks.start_process``) and exits on EOF once ours close (``process_start.py``).
* Shared memory: tensors travel with torch's ``file_descriptor`` strategy; segments are unlinked
  at creation and vanish with the last process holding them, so a killed process leaks none.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from headrace.runtime.handles import WorkerHandle
from headrace.runtime.threadworker import current_run


def stop(handles: list[WorkerHandle], grace_s: float, send_exits: bool,
         dispose: Callable[[WorkerHandle, float, bool], None],
         cut: Callable[[list[WorkerHandle]], None]) -> None:
    """Stop ``handles``: tell each to exit (``send_exits``; a shutdown finishing what an
    interrupt left told them already), give them ``grace_s`` seconds in all to exit on
    their own, then ``dispose(h, grace_left_s, quiet)`` each. Called in one of their own
    worker threads it waits for none (``quiet``). An interrupt (a Ctrl-C in a join) hands
    what is left undisposed to ``cut`` and goes on."""
    done = 0
    try:
        if send_exits:
            for h in handles:
                h.send_exit(now=True)
        here = current_run()
        inside = here is not None and any(h.process is here for h in handles)
        deadline = time.monotonic() + (0.0 if inside else grace_s)
        for h in handles:
            dispose(h, max(0.0, deadline - time.monotonic()), inside)
            done += 1
    except BaseException:
        cut(handles[done:])
        raise


def dispose(h: WorkerHandle, grace_s: float, quiet: bool = False) -> None:
    """Stop one worker (wait ``grace_s`` seconds for it to exit, then terminate, then kill)
    and close its pipes and ring; ``quiet``: a worker thread is given up on without a warning
    (see ``stop``). Idempotent."""
    p = h.process
    if getattr(p, "_closed", False):
        return  # disposed already
    if grace_s > 0:
        p.join(grace_s)
    if quiet and h.is_thread and p.is_alive():
        p.give_up()
    if p.is_alive():
        p.terminate()
        p.join(1.0)
    if p.is_alive():
        p.kill()
        p.join()
    for close in (h.conn.close, h.tasks.close):
        try:
            close()
        except (OSError, ValueError):
            pass
    if h.ring is not None:  # the worker is gone and its pipe closed: nothing reads it now
        h.ring.close()
    try:
        p.close()
    except ValueError:
        pass
