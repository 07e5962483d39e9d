"""Workers that die or hang, for one epoch's scheduler (``runtime/scheduler.py``, under its
lock).

A worker that dies (the OOM killer, SIGKILL, a segfault, a remote node lost) has the samples it
held run again on other workers; only the one it was running counts as an attempt, and a sample
out of attempts fails per the error policy. A worker stuck on one sample longer than
``sample_timeout_s`` is killed, and its death is handled the same way. A worker process that
dies before it is ready is replaced, not for ever. A retired worker that exited hands its
samples back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from headrace.errors import StepError, WorkerDiedError
from headrace.runtime.dispatch import running_longer_than
from headrace.runtime.handles import WorkerHandle
from headrace.runtime.lanes import Lanes
from headrace.runtime.pool import WorkerPool
from headrace.runtime.work import Counters, EpochSpec, Fatal, Rec, death_error, start_death_error

log = logging.getLogger("headrace")


class Deaths:
    """Deaths and hangs of one epoch's workers. ``fail(rec, error)``: the scheduler's way to
    fail a sample (settled, then raised or skipped)."""

    def __init__(self, pool: WorkerPool, spec: EpochSpec, lanes: Lanes, counters: Counters,
                 hooks: Any, fail: Callable[[Rec, StepError | WorkerDiedError], None]) -> None:
        self.pool = pool
        self.spec = spec
        self.lanes = lanes
        self.counters = counters
        self.hooks = hooks  # runtime.monitor.Monitor: on_worker_restart
        self.fail = fail
        self._hung: dict[int, tuple[int, int]] = {}  # slot -> (tid, step) of a killed hung task
        self._start_deaths: dict[int, int] = {}  # slot -> its workers that died before "ready"

    def ready(self, slot: int) -> None:
        """The worker in ``slot`` is ready: the deaths of its predecessors starting are past."""
        self._start_deaths.pop(slot, None)

    def kill_hung(self) -> None:
        """Replace workers stuck on one sample longer than ``sample_timeout_s``."""
        limit = self.spec.sample_timeout_s
        assert limit is not None
        for w, tid, _ in running_longer_than(self.pool, limit, list(self.pool.workers.values())):
            if w.slot not in self._hung:
                self._hung[w.slot] = (tid, self.pool.progress.step[w.slot])
                log.warning("headrace worker %d: sample over sample_timeout=%.3g s, replacing it",
                            w.slot, limit)
                w.process.kill()  # the death is handled like any other (sentinel fires)

    def on_death(self, w: WorkerHandle) -> None:
        """A worker died (OOM killer, SIGKILL, segfault): re-run what it held, replace it."""
        if w.retiring:  # a worker the scaler retired has exited
            self.lanes.retry.extend(self.lanes.recs[t] for t in w.assigned if t in self.lanes.recs)
            w.assigned.clear()
            self.pool.reap(w)
            return
        lost = [self.lanes.recs[t] for t in w.assigned if t in self.lanes.recs]
        running = self.pool.progress.tid[w.slot]
        hung = self._hung.pop(w.slot, None)
        w.assigned.clear()
        exitcode = w.process.exitcode
        if w.external:  # a backend's worker: its backend said why it ended (remote/: lost, or
            # never started, remote/starts.py); "died (exit code 0)" said neither
            log.info("headrace worker %d ended%s; re-running %d sample(s)", w.slot,
                     "" if w.ready else " before it started", len(lost))
        else:
            log.warning("headrace worker %d died (exit code %s); re-running %d sample(s)",
                        w.slot, exitcode, len(lost))
        for rec in lost:
            if rec.task.tid == running or len(lost) == 1 and w.ready:
                rec.attempts += 1  # only the sample it was running is suspect (none, starting)
            if rec.attempts >= self.spec.max_restarts:
                err = death_error(rec, hung, self.pool.pipeline.step_names, exitcode,
                                  self.spec.sample_timeout_s, w.slot)
                self.fail(rec, err)
            else:
                self.counters.retried += 1
                self.lanes.retry.append(rec)
        if not w.ready and not w.external:  # it died starting: replaced, but not for ever
            deaths = self._start_deaths[w.slot] = self._start_deaths.get(w.slot, 0) + 1
            if deaths > self.spec.max_restarts:  # (a fork of this process each time)
                raise Fatal(start_death_error(w.slot, deaths, exitcode))
        if self.pool.replace(w):  # not once the pool is shutting down
            self.hooks.on_worker_restart()
