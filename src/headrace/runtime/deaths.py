"""Workers that die or hang, for one epoch's scheduler (``runtime/scheduler.py``, under its
lock).

A worker that dies (the OOM killer, SIGKILL, a segfault, a remote node lost) has the samples it
held run again on other workers; only the one it was running counts as an attempt, and a sample
out of attempts fails per the error policy. A worker stuck on one sample longer than
``sample_timeout_s`` is killed, and its death is handled the same way. A worker process that
dies before it is ready is replaced, not for ever; one whose ``worker_init_fn`` raised is not
(``runtime/starts.py``). A retired worker that exited hands its samples back.
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
from headrace.runtime.work import (
    Counters,
    EpochSpec,
    Fatal,
    Rec,
    death_error,
    how_it_ended,
    start_death_error,
    step_name,
)

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
        if w.retiring or w.slot in self.pool.failed_slots and not w.external:
            # a worker the scaler retired has exited, or one whose start failed (its error
            # ended the epoch or will: runtime/starts.py); not replaced
            self.lanes.retry.extend(self.lanes.recs[t] for t in w.assigned if t in self.lanes.recs)
            w.assigned.clear()
            self.pool.reap(w)
            return
        lost = [self.lanes.recs[t] for t in w.assigned if t in self.lanes.recs]
        running = self.pool.progress.tid[w.slot]
        step = self.pool.progress.step[w.slot] if running != -1 else None  # where it died
        hung = self._hung.pop(w.slot, None)
        w.assigned.clear()
        exitcode = exit_code(w.process)
        if w.external:  # a backend's worker: its backend said why it ended (remote/: lost, or
            # never started, remote/starts.py); "died (exit code 0)" said neither
            log.info("headrace worker %d ended%s; re-running %d sample(s)", w.slot,
                     "" if w.ready else " before it started", len(lost))
        else:
            log.warning("headrace worker %d died (%s)%s; re-running %d sample(s)%s", w.slot,
                        how_it_ended(exitcode), self._running(lost, running, step),
                        len(lost), shown_indices(lost))
        for rec in lost:
            if rec.task.tid == running or len(lost) == 1 and w.ready:
                rec.attempts += 1  # only the sample it was running is suspect (none, starting)
                rec.died_on += (w.slot,)
                rec.died_in = step if rec.task.tid == running else None
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
                raise Fatal(start_death_error(w.slot, deaths, exitcode,
                                              self.pool.ctx.get_start_method()))
        if self.pool.replace(w):  # not once the pool is shutting down
            self.hooks.on_worker_restart()

    def _running(self, lost: list[Rec], running: int, step: int | None) -> str:
        """`` in step 'decode' on sample index 13``: what the dead worker was running."""
        rec = next((r for r in lost if r.task.tid == running), None)
        if rec is None:
            return ""
        name = step_name(self.pool.pipeline.step_names, step)
        return (f" in step {name!r}" if name is not None else "") + f" on sample index {rec.index}"


EXIT_WAIT_S = 1.0
"""Seconds a worker seen dead is waited for to become its parent's to reap. A worker's result
pipe reaches EOF as its process closes its descriptors, before the kernel lets the parent
collect its exit status: read at once, a SIGKILLed worker's exit code was ``None`` ("exit code
unknown: code in the step ended the process", in a loaded CI run). Once its sentinel is
readable the wait is immediate."""


def exit_code(process: Any) -> int | None:
    """The exit code of a worker process seen dead (its result pipe closed, or its sentinel
    readable), once it can be collected (at most ``EXIT_WAIT_S``); None if it could not."""
    process.join(EXIT_WAIT_S)
    return process.exitcode


SHOWN = 8
"""Sample indices a dead worker's warning lists; it counts the rest."""


def shown_indices(lost: list[Rec]) -> str:
    """``: indices [3, 7]``, the first ``SHOWN`` and how many more (nothing when none)."""
    if not lost:
        return ""
    more = f" and {len(lost) - SHOWN} more" if len(lost) > SHOWN else ""
    return f": indices [{', '.join(str(r.index) for r in lost[:SHOWN])}]{more}"
