"""``executor="auto"``: worker threads or worker processes, from how much of a step holds the GIL.

Threads skip what processes pay per sample (the copy of each finished sample through shared
memory and its pickled header, a process per worker) but share one interpreter lock: steps that
hold it for a share ``h`` of their time cannot run faster than ``1 / h`` threads' worth, however
many threads there are. Processes have no such limit but pay the copy. So threads win when the
lock is not what limits them: ``1 / h`` at least ``margin`` × the parallelism processes would
get, ``min(workers, cores)``.

Threads never re-seed the global random generators (they share them), so a step that draws
from Python's, NumPy's or torch's keeps the pipeline on processes: the probing workers compare
those generators' states around the steps of their first 64 samples
(``SampleRunner.on_global_draw``), and the first draw seen decides (:func:`global_draw_reason`).
Nor do threads get a ``WorkerInfo`` (torch keeps one per process): a step that calls
``get_worker_info()`` keeps processes too, once a probing worker saw it call
(``runtime/torch_worker.py``: :func:`worker_info_reason`). Nor do threads get their own copy of
the source and the step objects: one that sets an attribute while running samples (a file
handle opened on first use) keeps processes, once a probing worker saw it
(``runtime/state_watch.py``: :func:`state_reason`).

``h`` is measured, not guessed: a probe thread in each worker process (``runtime/gilprobe.py``)
sleeps a fraction of a millisecond at a time while a step runs and times how late it wakes; a
late wake-up means the step held the lock (CPython hands it over after the switch interval,
5 ms). What it cannot see: steps that let go of the lock often but briefly, such as NumPy on
CIFAR-sized arrays (each call releases it for microseconds, between Python that holds it), read
as free (16% held), and threads ran them 3x slower than processes. So the first epoch on
threads is a trial (:func:`after_trial`): when it delivers fewer samples per second than the
last epoch on processes did, by more than ``TRIAL_KEEP``, the loader goes back to processes for
good. Epochs shorter than ``TRIAL_MIN_S`` are added up until they reach it, on each executor
(:func:`pooled_rate`). Pure: the runtime measures, this decides.
"""

from __future__ import annotations

import dataclasses

from headrace.pipeline.pipeline import LOAD_STEP

MIN_PROBED_S = 1.0
"""Seconds of step time the probes must have watched (summed over workers) before deciding."""
MARGIN = 0.9
"""Threads are chosen when ``1 / h >= MARGIN × min(workers, cores)`` (see the module docstring)."""
TRIAL_KEEP = 0.9
"""Threads stay after their first epoch if it delivered at least this share of the samples per
second of the last epoch on processes (whose rate the probing lowers a little: a tie keeps
threads, which hold no copy of a sample and no process per worker)."""
TRIAL_MIN_S = 1.0
"""Wall seconds of epochs a rate is taken over: consecutive shorter epochs on one executor are
added up (samples and wall seconds, :func:`pooled_rate`) until they reach it."""


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
    bar = f"{margin:g} × the {parallel}"  # the margin said: 1.9 'enough for 2' read as wrong
    if threads:
        why += (f", at least {bar} that min(workers, cores) allows: threads save the copy "
                "of every sample between processes")
    else:
        why += f", under {bar} processes would run in parallel"
    return ExecutorDecision("threads" if threads else "processes", h, probed_s, parallel, why)


def after_trial(decision: ExecutorDecision, threads_rate: float, processes_rate: float,
                keep: float = TRIAL_KEEP) -> ExecutorDecision:
    """``decision`` (threads) after its first epoch delivered ``threads_rate`` samples/s against
    ``processes_rate`` for the last epoch on processes: kept at ``keep`` × that or more, else
    processes, with both rates in the reason."""
    if threads_rate >= keep * processes_rate:
        return decision
    why = (f"threads were tried for an epoch and delivered {threads_rate:.0f} samples/s against "
           f"{processes_rate:.0f} on processes ({threads_rate / processes_rate:.2f}x), so "
           f"processes again for good (the GIL probes had read the steps as holding it "
           f"{decision.held_share:.0%} of their time: steps that let go of it often but briefly "
           "read as free)")
    return dataclasses.replace(decision, executor="processes", reason=why)


def pooled_rate(window: tuple[float, float], samples: float, wall_s: float,
                min_s: float = TRIAL_MIN_S) -> tuple[tuple[float, float], float | None]:
    """Add an epoch (``samples`` delivered in ``wall_s`` seconds) to ``window`` (samples,
    wall seconds of the consecutive epochs added so far on one executor): the new window and
    None while it holds under ``min_s`` seconds, else an empty window and its rate (samples per
    second over all of its epochs). Epochs shorter than a second taken one by one were never
    compared: a short-epoch job kept a wrong choice of threads for good (a hunt)."""
    n, w = window[0] + samples, window[1] + wall_s
    if w < min_s:
        return (n, w), None
    return (0.0, 0.0), n / w


def global_draw_reason(step: str) -> str:
    """Why ``executor="auto"`` stays on processes once step ``step`` was seen drawing from
    Python's, NumPy's or torch's global generator (``SampleRunner.on_global_draw``)."""
    return (f"step {step!r} draws from a global random generator (Python's, NumPy's or "
            "torch's), which worker processes re-seed per sample and step and threads would "
            "share: threads would change what it computes (give the step random=True and draw "
            "from its rng to allow them)")


def worker_info_reason(step: str) -> str:
    """Why ``executor="auto"`` stays on processes once step ``step`` was seen calling
    ``get_worker_info()`` (``runtime/torch_worker.watch_worker_info_reads``)."""
    return (f"step {step!r} calls get_worker_info(), which answers in worker processes (their "
            "id, seed and dataset copy) and returns None in worker threads: threads would "
            "change what it computes")


def state_reason(step: str, attr: str) -> str:
    """Why ``executor="auto"`` stays on processes once a probing worker saw the object of step
    ``step`` (``"load"``: the source) gain or rebind attribute ``attr`` while it ran samples
    (``runtime/state_watch.py``)."""
    where = "the source" if step == LOAD_STEP else f"step {step!r}"
    return (f"{where} set its attribute {attr!r} while running samples: state kept per worker "
            "(a file handle opened on first use, a reader, a counter) is one object for all "
            "worker threads, which would share it and could change what it computes (a "
            "handle's seek and read interleaved between threads delivers other samples' bytes)")


def forced_processes(reason: str) -> ExecutorDecision:
    """``executor="auto"`` where threads cannot be used at all (``reason`` says why)."""
    return ExecutorDecision("processes", float("nan"), 0.0, 0, reason)
