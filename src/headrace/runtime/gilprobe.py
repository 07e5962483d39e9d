"""How much of a worker process's step time holds the GIL (for ``executor="auto"``).

A daemon thread in the worker sleeps ``PERIOD_S`` at a time while the worker runs a step and
times how late it wakes. The wake-up needs the GIL: while the step's Python code holds it, the
probe waits until CPython forces a switch (``sys.getswitchinterval()``, 5 ms by default); while
the step runs in C code that released it (decoding, NumPy, torch ops), the probe gets it at once.
The lateness above ``JITTER_S`` counts as held time. It stops after ``BUDGET_S`` of probed step
time, or once the training process has decided, so it costs nothing after the warm-up. On a
machine whose cores are all busy a late wake-up may also be a wait for a core, not for the GIL:
on Linux the probe subtracts the time its thread spent runnable without a core (``/proc/thread-
self/schedstat``, second field) from both its lateness and its probed time (:func:`probe_times`);
a thread waiting for the GIL sleeps on a condition variable, which that field does not count.

The totals go to shared per-slot arrays (``handles.Progress.gil_held`` / ``gil_probed``, seconds)
that the training process reads (``planner/executor.py`` decides).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from headrace.profiler.runqueue import run_queue_s

PERIOD_S = 0.0002
"""Sleep of one probe (seconds): short, so a held GIL shows as most of a probe's time."""
JITTER_S = 0.0005
"""Lateness below this is the OS's wake-up jitter, not the GIL (seconds)."""
BUDGET_S = 2.0
"""Step time a worker probes before its probe thread exits (seconds)."""
IDLE_POLL_S = 0.005
"""How often the probe checks whether its worker has started a step (seconds)."""


def start_probe(progress: Any, slot: int) -> threading.Thread:
    """Start the probe thread of worker ``slot`` (see the module docstring)."""
    t = threading.Thread(target=_probe, args=(progress, slot), daemon=True,
                         name="headrace-gil-probe")
    t.start()
    return t


def probe_times(wall_s: float, core_wait_s: float, period_s: float) -> tuple[float, float]:
    """``(probed, late)`` seconds of a probe that took ``wall_s`` seconds, ``core_wait_s`` of
    them runnable without a core, around a sleep of ``period_s``. The wait for a core leaves
    both: counted as probed but not as late, it read a pure-Python step as 58-69% held with
    two busy loops beside two workers on 2 cores (threads are chosen at 55.6% or less there),
    66-81% without it."""
    probed = max(0.0, wall_s - core_wait_s)
    return probed, probed - period_s


def _probe(progress: Any, slot: int) -> None:
    """Probe until ``BUDGET_S`` of step time is watched, or the training process has decided
    (``Progress.probe_stop``: the probes cost the worker a wake-up every ``PERIOD_S``).

    Each probe is timed whole, from before the first run-queue read to after the second: every
    call in it that releases the GIL (the sleep and both reads) waits for the lock again while
    the step holds it. A probe counts when its worker was busy at its start or at its end: the
    probe gets the lock back mostly when the worker releases it, which is when a step ends, so
    probes that a step boundary cut were most of them (counting only the sleep of probes busy
    at both ends watched 0.3 s of a Python-bound worker's 1 s of steps, too little for
    ``executor="auto"`` to decide within an epoch). While the worker idles the probe sleeps
    ``IDLE_POLL_S`` at a time; when a step started during that sleep, the probe counts from the
    step's start (``progress.started``, ``time.monotonic()``)."""
    busy, started = progress.tid, progress.started
    held_arr, probed_arr = progress.gil_held, progress.gil_probed
    held = probed = 0.0
    stop = progress.probe_stop
    while probed < BUDGET_S and not stop.value:
        was_busy = busy[slot] >= 0
        period = PERIOD_S if was_busy else IDLE_POLL_S
        t0 = time.monotonic()
        q0 = run_queue_s()
        time.sleep(period)
        q1 = run_queue_s()
        t1 = time.monotonic()
        dt, late = probe_times(t1 - t0, q1 - q0, period)
        if not was_busy:
            if busy[slot] < 0:
                continue  # idle from start to end: nothing to measure
            dt = min(dt, max(0.0, t1 - started[slot]))  # from the step's start
            late = min(late, dt)
        probed += dt
        if late > JITTER_S:
            held += late
        held_arr[slot], probed_arr[slot] = held, probed
