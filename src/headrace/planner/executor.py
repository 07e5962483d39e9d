"""``executor="auto"``: worker threads or worker processes, from how much of a step holds the GIL.

Threads skip what processes pay per sample (the copy of each finished sample through shared
memory and its pickled header, a process per worker) but share one interpreter lock: steps that
hold it for a share ``h`` of their time cannot run faster than ``1 / h`` threads' worth, however
many threads there are. Processes have no such limit but pay the copy. So threads win when the
lock is not what limits them: ``1 / h`` at least ``margin`` × the parallelism processes would
get, ``min(workers, cores)``.

Threads never re-seed the global random generators (they share them), so a step that draws
from Python's, NumPy's or torch's keeps the pipeline on processes: the probing workers compare
those generators' states around the steps of the samples they measure
(``SampleRunner.on_global_draw``), and the first draw seen decides (:func:`global_draw_reason`).

``h`` is measured, not guessed: a probe thread in each worker process (``runtime/gilprobe.py``)
sleeps a fraction of a millisecond at a time while a step runs and times how late it wakes; a
late wake-up means the step held the lock (CPython hands it over after the switch interval,
5 ms). Pure: the runtime measures, this decides.
"""

from __future__ import annotations

import dataclasses

MIN_PROBED_S = 1.0
"""Seconds of step time the probes must have watched (summed over workers) before deciding."""
MARGIN = 0.9
"""Threads are chosen when ``1 / h >= MARGIN × min(workers, cores)`` (see the module docstring)."""


@dataclasses.dataclass(frozen=True)
class ExecutorDecision:
    """What ``executor="auto"`` chose and the numbers behind it.

    Attributes:
        executor: ``"threads"`` or ``"processes"``.
        held_share: measured share (0..1) of step time the steps held the GIL (``nan``: not
            measured).
        probed_s: seconds of step time the probes watched, summed over workers.
        parallel: ``min(workers, cores)``: the parallelism processes would get.
        reason: why, in a sentence (for ``explain()``).
    """

    executor: str
    held_share: float
    probed_s: float
    parallel: int
    reason: str

    def describe(self) -> str:
        return f'executor="auto" chose {self.executor}: {self.reason}'


def choose_executor(held_s: float, probed_s: float, workers: int, cores: int,
                    margin: float = MARGIN) -> ExecutorDecision | None:
    """Decide from ``held_s`` seconds of GIL holding seen in ``probed_s`` seconds of step time
    (both summed over the worker processes); ``None`` until ``MIN_PROBED_S`` are probed."""
    if probed_s < MIN_PROBED_S:
        return None
    h = min(1.0, max(0.0, held_s / probed_s))
    parallel = max(1, min(workers, cores))
    room = 1.0 / h if h > 0 else float("inf")
    threads = room >= margin * parallel
    why = (f"steps held the GIL {h:.0%} of their time (probed {probed_s:.1f} s of steps), so "
           f"threads can run about {room:.1f} at once" if h > 0 else
           f"steps released the GIL all the time (probed {probed_s:.1f} s of steps)")
    if threads:
        why += (f", enough for the {parallel} that min(workers, cores) allows: threads save "
                "the copy of every sample between processes")
    else:
        why += f", fewer than the {parallel} processes would run in parallel"
    return ExecutorDecision("threads" if threads else "processes", h, probed_s, parallel, why)


def global_draw_reason(step: str) -> str:
    """Why ``executor="auto"`` stays on processes once step ``step`` was seen drawing from
    Python's, NumPy's or torch's global generator (``SampleRunner.on_global_draw``)."""
    return (f"step {step!r} draws from a global random generator (Python's, NumPy's or "
            "torch's), which worker processes re-seed per sample and step and threads would "
            "share: threads would change what it computes (give the step random=True and draw "
            "from its rng to allow them)")


def forced_processes(reason: str) -> ExecutorDecision:
    """``executor="auto"`` where threads cannot be used at all (``reason`` says why)."""
    return ExecutorDecision("processes", float("nan"), 0.0, 0, reason)
