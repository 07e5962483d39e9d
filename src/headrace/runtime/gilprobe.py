"""How much of a worker process's step time holds the GIL (for ``executor="auto"``).

A daemon thread in the worker sleeps ``PERIOD_S`` at a time while the worker runs a step and
times how late it wakes. The wake-up needs the GIL: while the step's Python code holds it, the
probe waits until CPython forces a switch (``sys.getswitchinterval()``, 5 ms by default); while
the step runs in C code that released it (decoding, NumPy, torch ops), the probe gets it at once.
The lateness above ``JITTER_S`` counts as held time. It stops after ``BUDGET_S`` of probed step
time, so it costs nothing after the warm-up. On a machine whose cores are all busy a late
wake-up may also be a wait for a core, not for the GIL: on Linux the probe subtracts the time
its thread spent runnable without a core (``/proc/thread-self/schedstat``, second field); a
thread waiting for the GIL sleeps on a condition variable, which that field does not count.

The totals go to shared per-slot arrays (``pool.Progress.gil_held`` / ``gil_probed``, seconds)
that the training process reads (``planner/executor.py`` decides).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

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


def _run_queue_s() -> Callable[[], float]:
    """Seconds this thread has waited for a core so far (0 where the kernel does not say)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            f.read()
    except OSError:
        return lambda: 0.0

    def read() -> float:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9

    return read


def _probe(progress: Any, slot: int) -> None:
    busy = progress.tid
    held_arr, probed_arr = progress.gil_held, progress.gil_probed
    run_queue = _run_queue_s()
    held = probed = 0.0
    while probed < BUDGET_S:
        if busy[slot] < 0:
            time.sleep(IDLE_POLL_S)
            continue
        q0 = run_queue()
        t0 = time.perf_counter()
        time.sleep(PERIOD_S)
        dt = time.perf_counter() - t0
        late = dt - PERIOD_S - (run_queue() - q0)
        if busy[slot] < 0:
            continue  # the step ended meanwhile: this probe measured idle time
        probed += dt
        if late > JITTER_S:
            held += late
        held_arr[slot], probed_arr[slot] = held, probed
