"""Where worker processes fork: on the thread that iterates the loader, never on the scheduler's.

A forked child has one thread, the one that called ``fork()``, and every lock that another
thread of the parent held at that moment stays held in the child for ever. The training thread
holds torch's native locks inside its operators: the CPU generator's during every random draw
(``torch.randn``, dropout on a CPU), and others. Measured (a one-off script, 2 cores): of 10
children forked by a second thread while the training thread ran ``torch.randn`` in a loop, 9
hung in their first ``torch.manual_seed``; a headrace worker replaced mid-epoch from the
scheduler thread hung the same way (``futex_wait``, never ready), and its epoch took 6.4 s
instead of 0.7. torch's DataLoader forks its workers in ``iter()``, on the training thread,
between two of its operations, where it holds none of them.

headrace forks there too: the pool's first workers in ``iter()``; a worker the scaler adds and
one that replaces a dead one are asked for on the scheduler thread (:class:`StartRequests`) and
forked by the training thread in ``EpochIterator.take``: when no batch is ready (it would wait
anyway; woken if it already waits), or once a request has waited ``DEFER_S`` with batches ready.
Forking at once in ``take`` put each fork (8-29 ms in the benchmark process on 2 cores) on the
path of a fed training loop, where the scheduler thread's forks overlapped its steps: the
first epoch of ``num_workers="auto"`` on speech-3s took 1-2% longer; deferred, it is level
(docs/benchmarks.md, "Workers fork on the training thread").
Worker threads and the ``spawn`` and ``forkserver`` start methods run no parent code in the
child, and start at once from any thread. Not covered: other threads of the training process
that run user code while the training thread forks, as torch's forks in ``iter()`` do not
cover them either: the user's own, and the collate threads (``runtime/collate_rng.py``) running
a ``collate_fn`` that draws from torch's generator too rarely to be moved to the training loop.

How a worker process forks (:func:`start_process`): with the garbage collector off from the
fork until the child froze what it inherited (``worker.forked_main``), one fork at a time
across loaders (docs/design.md).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from headrace.runtime.worker import forked_main, worker_main

DEFER_S = 0.5
"""Seconds a requested worker may wait for the training loop to run out of ready batches
before it is forked all the same (half the scaler's decision interval)."""


class StartRequests:
    """Worker starts asked for by one thread and carried out by another (``pop``).

    A request is ``(slot, num_workers)``: the slot of the worker it replaces (None: any free
    one) and the worker count its ``get_worker_info()`` reports (None: the pool's). ``on_asked``
    (set by the epoch that iterates the pool) wakes the thread that carries them out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: list[tuple[int | None, int | None, float]] = []  # ..., time.monotonic()
        self.on_asked: Callable[[], None] | None = None

    def __len__(self) -> int:
        """Starts asked for and not yet popped."""
        return len(self._asked)

    def ask(self, slot: int | None, num_workers: int | None) -> None:
        with self._lock:
            self._asked.append((slot, num_workers, time.monotonic()))
        wake = self.on_asked
        if wake is not None:
            wake()

    def due(self, idle: bool, now: float | None = None) -> bool:
        """Fork now? Something is asked, and the training thread has no batch to take
        (``idle``) or the oldest request waited ``DEFER_S`` seconds (``now``: monotonic)."""
        asked = self._asked
        if not asked:
            return False
        return idle or (time.monotonic() if now is None else now) - asked[0][2] >= DEFER_S

    def pop(self) -> tuple[int | None, int | None] | None:
        """The next request to carry out (None: none): the first replacement of a given slot,
        else the first asked. A replacement goes first so that a request for any slot, asked
        before the death, does not take the dead worker's slot (its ``get_worker_info().id``,
        its count of deaths while starting)."""
        with self._lock:
            if not self._asked:
                return None
            i = next((k for k, req in enumerate(self._asked) if req[0] is not None), 0)
            slot, num_workers, _ = self._asked.pop(i)
            return slot, num_workers

    def cancel(self, n: int) -> int:
        """Withdraw up to ``n`` requests for any slot, the latest first (a scaler that lowered
        its count before they were forked); replacements stay. Returns how many."""
        with self._lock:
            gone = 0
            for k in range(len(self._asked) - 1, -1, -1):
                if gone < n and self._asked[k][0] is None:
                    del self._asked[k]
                    gone += 1
            return gone

    def drop(self) -> None:
        """Forget every request (the pool is shutting down, or starts afresh)."""
        with self._lock:
            self._asked = []


_FORKING = threading.Lock()
"""Held while a worker forks with the collector off (:func:`start_process`). The collector's
state is the process's: two loaders forking at once from two threads read it as the other had
left it, and a worker then ran its whole life without a collector, or collected before its
freeze (a review's repro: 12 batches from workers with the collector off)."""


def _unlock_in_child() -> None:
    global _FORKING
    _FORKING = threading.Lock()  # a fork taken while another thread held it


os.register_at_fork(after_in_child=_unlock_in_child)


def start_process(ctx: Any, args: tuple[Any, ...], name: str,
                  parent_ends: tuple[Any, ...] = ()) -> Any:
    """Start a worker process of multiprocessing context ``ctx`` running
    ``worker.worker_main(*args)``; returns the started ``Process``. Forked, no collection runs
    between the fork and the child's ``gc.freeze()`` (``worker.forked_main``): the training
    process's garbage is never finalised in a worker, and the training process's own frozen
    objects stay as its user froze them; the child closes its copies of ``parent_ends`` (the
    training process's ends of its own pipes), so it reads EOF once the training process
    closes them. An exception after the fork (a Ctrl-C) stops the started process
    (:func:`stop_started`) before it propagates."""
    proc = None
    try:
        if ctx.get_start_method() != "fork":
            proc = ctx.Process(target=worker_main, args=args, daemon=True, name=name)
            proc.start()
            return proc
        with _FORKING:
            collecting = gc.isenabled()
            gc.disable()
            try:
                proc = ctx.Process(target=forked_main, args=(collecting, parent_ends, *args),
                                   daemon=True, name=name)
                proc.start()
            finally:
                if collecting:
                    gc.enable()
        return proc
    except BaseException:
        if proc is not None:
            stop_started(proc)
        raise


def stop_started(proc: Any) -> None:
    """Kill and reap ``proc`` if it was started (an exception cut its start, or its record
    in the pool, short). One cut inside ``multiprocessing`` before it kept the child's pid
    cannot be killed here: that child exits on EOF (``start_process``'s ``parent_ends``)."""
    if proc.pid is None:
        return
    with contextlib.suppress(OSError, ValueError, AssertionError):
        proc.kill()
        proc.join()
