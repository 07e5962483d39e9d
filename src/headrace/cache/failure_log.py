"""A cache's first backend failure, logged once per loader by the training process as soon as
it sees it.

Workers and the training process keep their first failure in their counter row
(``Counters.note_failure``, passwords redacted there: ``CacheClient.failed``): a worker's own
log line was repeated by every worker of every epoch (a fresh process each) and never reached
the training process's logging.
:class:`FailureLog` reads the rows while the epoch runs: at each tick of the scheduler thread
with workers, every ``SAMPLES_BETWEEN`` samples in either thread (the loader's ``Monitor``
tick and sample listeners), and when an epoch closes. Read only at the
close, a Redis killed after batch 1 was said after the epoch's 24 batches, a multi-hour epoch
said nothing for hours, and a job killed mid-epoch nothing at all.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from headrace.cache.counters import Counters

log = logging.getLogger("headrace")

SAMPLES_BETWEEN = 8
"""Samples between two checks from the sample listener (the tick listener checks at each tick)."""


class FailureLog:
    """Logs the first failure ``counters`` kept, once (:meth:`warn`), from whichever thread
    of the training process sees it first (the scheduler thread's or the training thread)."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self.said = False
        """The failure was logged: the later ones are counted only (``CacheStats.errors``)."""
        self._lock = threading.Lock()

    def warn(self) -> None:
        """Log the first failure a row kept, unless one was logged; about a microsecond while
        no row kept one (``Counters.first_failure``)."""
        if self.said:
            return
        text = self.counters.first_failure()
        if text is None:
            return
        with self._lock:
            if self.said:
                return
            self.said = True
        log.warning("headrace: the cache failed (%s); continuing without it where it fails "
                    "(counted in stats().last.cache.errors)", text)  # redacted where kept

    def listen(self, monitor: Any) -> None:
        """Have ``monitor``'s (a ``runtime.monitor.Monitor``) tick listeners call :meth:`warn`,
        and its sample listeners every ``SAMPLES_BETWEEN`` samples (without workers there is
        no tick); held weakly, so the monitor does not keep this alive. At every sample the
        check cost the training process about a microsecond a sample (tiny samples: 4% fewer
        samples/s, ``python -m headrace.bench.small_samples``)."""
        ref = weakref.ref(self)
        count = [0]

        def check(*_: Any) -> None:
            me = ref()
            if me is not None:
                me.warn()

        def every(*_: Any) -> None:
            count[0] += 1
            if not count[0] % SAMPLES_BETWEEN:
                check()

        monitor.tick_listeners.append(check)
        monitor.sample_listeners.append(every)
