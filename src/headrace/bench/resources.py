"""Resource use of one benchmark run: peak RSS, CPU-seconds, and the machine's other load.

:class:`ResourceMonitor` samples, in a thread, the resident memory of the training process plus
all its descendants (the loader's workers) and records CPU-seconds with ``getrusage`` deltas
(``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``). Children count in ``RUSAGE_CHILDREN`` only once they
have been reaped, so :meth:`ResourceMonitor.stop` must run after the loader joined its workers.
The sampling thread's own CPU is subtracted from the training process's.

RSS is summed over processes, so pages shared between forked workers and the parent are counted
once per process: compare loaders with each other, not with the machine's memory.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import threading
import time

import psutil


@dataclasses.dataclass(frozen=True)
class ResourceUse:
    """What one run used.

    Attributes:
        peak_rss_bytes: largest sampled sum of RSS over the training process and its
            descendants (bytes).
        cpu_s: CPU-seconds (user + system) of the training process and the workers it reaped
            during the run, the sampler thread excluded.
        main_cpu_s: CPU-seconds of the training process alone (every thread but the sampler):
            the consumer loop, the loader's threads, collation done in the main process.
        machine_busy_s: busy CPU-seconds of the whole machine over the run (all cores), as
            ``/proc/stat`` counts them; ``machine_busy_s - cpu_s`` is other processes' load.
        samples: RSS samples taken.
    """

    peak_rss_bytes: int
    cpu_s: float
    main_cpu_s: float
    machine_busy_s: float
    samples: int


def _rusage_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


class ResourceMonitor:
    """Samples RSS every ``interval_s`` seconds between :meth:`start` and :meth:`stop`."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self._me = psutil.Process(os.getpid())
        self._procs: dict[int, psutil.Process] = {}
        self._peak = 0
        self._count = 0
        self._thread_cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-resources", daemon=True)
        self._self0 = self._children0 = self._busy0 = 0.0

    def start(self) -> ResourceMonitor:
        """Take the CPU baselines and start sampling."""
        self._self0 = _rusage_s(resource.RUSAGE_SELF)
        self._children0 = _rusage_s(resource.RUSAGE_CHILDREN)
        self._busy0 = _busy_s()
        self._thread.start()
        return self

    def stop(self) -> ResourceUse:
        """Stop sampling (call after the loader's workers were joined) and return the totals."""
        self._stop.set()
        self._thread.join()
        self._sample()  # one last sample, in this thread
        main = _rusage_s(resource.RUSAGE_SELF) - self._self0 - self._thread_cpu_s
        children = _rusage_s(resource.RUSAGE_CHILDREN) - self._children0
        return ResourceUse(
            peak_rss_bytes=self._peak,
            cpu_s=main + children,
            main_cpu_s=main,
            machine_busy_s=_busy_s() - self._busy0,
            samples=self._count,
        )

    def _run(self) -> None:
        c0 = time.thread_time()
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)
        self._thread_cpu_s = time.thread_time() - c0

    def _sample(self) -> None:
        try:
            kids = self._me.children(recursive=True)
        except psutil.Error:
            kids = []
        total = 0
        alive: dict[int, psutil.Process] = {}
        for p in [self._me, *kids]:
            proc = self._procs.get(p.pid, p)  # reuse the object: psutil caches per process
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                continue
            alive[p.pid] = proc
        self._procs = alive
        self._peak = max(self._peak, total)
        self._count += 1
