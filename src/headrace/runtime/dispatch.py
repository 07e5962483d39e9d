"""Dispatch: which sample each worker gets next (the scheduler thread's half that sends).

MinatoLoader Algorithm 1's lanes, done with worker processes (``runtime/scheduler.py`` runs it):

* fast lane: fresh samples go to any worker with room: ``DEPTH`` assigned at once (one running,
  one queued to hide the round trip), deeper when samples are cheap and every worker is a local
  process (``planner/queueing.py``: a pass's fresh samples for one worker then travel in one
  message); one while the worker runs a sample over the timeout, or near the end of the epoch,
  so no sample waits behind a slow one. A worker with nothing to do takes over a sample queued behind
  a slow one elsewhere (``_steal``).
* slow lane: at most ``slow_lane_share`` of the workers (at least one for a share above 0, none
  for 0) run slow-lane samples while fresh samples are waiting, so fast samples always have most
  of the pool; when no fresh sample may start, any worker takes slow-lane work, so the pool stays
  work-conserving within the user's worker budget and a handed-off sample always finishes. A
  backlog longer than the pool lifts the share.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

from headrace.runtime.handles import WorkerHandle
from headrace.runtime.lanes import Lanes
from headrace.runtime.pool import WorkerPool
from headrace.runtime.work import Counters, EpochSpec
from headrace.runtime.worker import Task

DEPTH = 2
"""Samples assigned to one worker at once (worker processes with cheap samples: more)."""


class Dispatcher:
    """Sends work to the pool's workers; state shared with the scheduler that owns it (and
    changed under its lock): the lanes, the counters, the workers' ``assigned``."""

    def __init__(self, pool: WorkerPool, spec: EpochSpec, lanes: Lanes, counters: Counters,
                 hooks: Any, in_flight: Callable[[], int]) -> None:
        self.pool = pool
        self.spec = spec
        self.lanes = lanes
        self.counters = counters
        self.hooks = hooks  # runtime.monitor.Monitor: slow_threshold_s, queue_depth, hold_s
        self.in_flight = in_flight  # samples pulled from the sampler and not yet yielded
        self._slow_takers: list[WorkerHandle] = []  # workers with prefers_slow dispatched to

    def dispatch(self) -> None:
        """Give ready workers work up to their depth (the pool's first workers while they
        start, too: ``WorkerHandle.eager``); idle ones what waits behind slow samples."""
        pool = list(self.pool.workers.values())
        workers = [w for w in pool if (w.ready or w.eager) and not w.retiring
                   and (w.gate is None or w.gate())]
        if not workers:
            return
        # The slow lane gets its share of the workers, at least one for a share above 0 (none
        # for 0: it then runs when nothing fresh may start, ``Lanes.choose``); a backlog longer
        # than the pool means that share is too small for this workload (slow samples carry
        # most of the work), and starving it would only fill the in-flight budget with waiting
        # samples: lift the cap.
        share = self.spec.slow_lane_share
        slow_cap = max(1, int(share * len(workers))) if share > 0 else 0
        if len(self.lanes.backlog) > len(workers):
            slow_cap = len(workers) * DEPTH
        slow_now = self._over_timeout(workers)
        # workers that take slow-lane samples first (remote ones with Remote(slow_lane=True)):
        # the others then leave the backlog to them unless nothing fresh may start
        self._slow_takers = [w for w in workers if w.prefers_slow]
        # near storage (remote/storage.py): fresh samples go to the storage nodes' fetchers
        # while one runs, the others resume what they hand back
        fetchers = any(w.fetches for w in workers)
        # cheap samples: worker processes get more at once, in one message (planner/queueing.py);
        # not beside threads or remote workers, which take two at a time: deeper local queues
        # would take the samples an offload ratio or a storage node's fetchers were to get
        deep = self.hooks.queue_depth() if all(w.ring is not None for w in pool) else DEPTH
        hold = self.hooks.hold_s(deep) if deep > DEPTH else 0.0
        outbox: dict[WorkerHandle, list[Task]] = {}
        try:
            self._fill(workers, deep, slow_now, slow_cap, fetchers, outbox)
        finally:  # a sampler error mid-pass: what was taken is assigned, so nothing is lost
            for w, tasks in outbox.items():
                self.counters.task_messages += len(tasks) > 1
                w.send_many(tasks, hold)
        idle = [w for w in workers if not w.assigned and w.ready]
        if not idle:
            return
        starting = [w for w in pool if not w.ready and w.assigned and not w.retiring
                    and not w.fetches]  # eager, or no longer (its first samples moving)
        if slow_now or starting:
            self._steal(idle, workers, slow_now, starting)

    def _fill(self, workers: list[WorkerHandle], deep: int, slow_now: dict[int, float],
              slow_cap: int, fetchers: bool, outbox: dict[WorkerHandle, list[Task]]) -> None:
        """Give each worker up to ``deep`` samples (``DEPTH`` unless every worker is a local
        process); fresh samples for a worker process go to ``outbox`` (one message each).
        Level by level, so each worker gets its first before any gets its second; the levels
        every worker already holds are skipped (with deep queues, most of them each pass)."""
        lanes = self.lanes
        margin = deep * len(self.pool.workers)
        slow_first = {w: functools.partial(self._may_take_slow, w, slow_cap) for w in workers}
        for depth in range(1 + min(len(w.assigned) for w in workers), deep + 1):
            for w in workers:
                if depth > 1 and w.slot in slow_now:
                    continue  # nothing queues behind a sample already over the timeout
                if depth > DEPTH and not w.ready:
                    continue  # still starting (``eager``): the usual two until it runs
                while len(w.assigned) + len(outbox.get(w, ())) < depth:
                    near_end = depth > 1 and lanes.near_end(margin)
                    fresh_ok = not near_end and (w.fetches or not fetchers)
                    rec = lanes.choose(fresh_ok, slow_first[w], self.in_flight(),
                                       backlog_ok=not w.fetches, runs=w.runs)
                    if rec is None:
                        if (fresh_ok or near_end) and not lanes.retry and not lanes.backlog:
                            # nothing fresh may start (the in-flight cap, the sampler is done,
                            # or the epoch's tail, past the first level) and nothing else
                            # waits: no worker gets more at this level or deeper ones (with
                            # 128-deep queues, up to 256 empty tries a pass)
                            return
                        break
                    rec.worker = w.slot
                    if w.ring is not None and rec.task.start == 0:
                        outbox.setdefault(w, []).append(rec.task)
                    else:
                        self._send(w, rec.task)

    def _send(self, w: WorkerHandle, task: Task) -> None:
        """Send ``task`` to ``w``; a slow-lane sample's send (its partial value pickled, large
        arrays shared) counts in the cost of moving it (``Counters.forward_cpu_s``)."""
        if task.start == 0:
            w.send(task)
            return
        c0 = time.thread_time()
        w.send(task)
        self.counters.forward_cpu_s += time.thread_time() - c0

    def _may_take_slow(self, w: WorkerHandle, slow_cap: int) -> bool:
        """Whether ``w`` may take a slow-lane sample before fresh ones: a worker that prefers
        them (remote, ``Remote(slow_lane=True)``) always; the others while the slow lane has
        less than its share and no such worker is there to take the next one (a sample handed
        back at the split point is the local workers' own: ``WorkerHandle.runs``)."""
        if w.prefers_slow:
            return True
        if self._slow_takers and self.lanes.backlog:
            head = self.lanes.backlog[0].task
            if any(t.runs is None or t.runs(head) for t in self._slow_takers):
                return False
        return self._slow_running() < slow_cap

    def _over_timeout(self, workers: list[WorkerHandle]) -> dict[int, float]:
        """Workers running a task of theirs for longer than the timeout: slot -> its start."""
        limit = self.hooks.slow_threshold_s()
        if not math.isfinite(limit):
            return {}
        return {w.slot: started for w, _, started in running_longer_than(self.pool, limit, workers)}

    def _steal(
        self, idle: list[WorkerHandle], workers: list[WorkerHandle], slow_now: dict[int, float],
        starting: list[WorkerHandle],
    ) -> None:
        """Give idle workers the tasks queued behind slow samples, or on workers still starting
        (they have nothing else).

        A task queued on a worker that runs a slow sample would wait for it while others idle;
        at the end of an epoch the last batch waits for it. It moves to an idle worker under a
        new tid, and its old worker is told to skip the old tid (``Progress.revoked``). Should
        the old worker start it anyway (a race), its result carries the old tid and is dropped
        as stale: the sample is still delivered once. A worker over the timeout gets no new
        queued task (``_fill``). With a deeper queue (cheap samples) several may wait behind it:
        one moves per pass, and a slot remembers only the last ``REVOKED_KEPT`` (2) revoked ids,
        so the worker may still run an earlier-moved one; its result is dropped as stale
        (wasted work, not a duplicate).

        The pool's first workers get their first samples before they are ready (``eager``): a
        worker whose ``worker_init_fn`` took long, or never returned, held them while the
        others ran out of work, and an epoch waiting for them never ended (torch's too hangs).
        Its samples move the same way to a worker that is ready and idle, and it gets no more
        until it is ready (``eager`` off). Only ready workers take: a worker still starting is
        no thief, and neither is one that would not run the task (``WorkerHandle.runs``: a
        remote worker is given no sample handed back at its split point).
        """
        prog = self.pool.progress
        victims = sorted((w for w in workers if w.slot in slow_now and len(w.assigned) > 1
                          and not w.fetches),  # near storage: its samples stay on storage
                         key=lambda w: slow_now[w.slot])  # the longest-running first
        victims += starting
        idle = list(idle)
        for victim in victims:
            if not idle:
                return
            running = prog.tid[victim.slot]
            # the last queued: earlier ones may be done already, kept by the worker (Outbox)
            queued = next((t for t in reversed(victim.assigned) if t != running), None)
            if queued is None or queued not in self.lanes.recs:
                continue
            # a thief that runs it: a remote worker sent a sample handed back at its split
            # point straight back (``WorkerHandle.runs``), a round trip for nothing
            thief = next((w for w in idle if w.runs is None or w.runs(victim.assigned[queued])),
                         None)
            if thief is None:
                continue
            idle.remove(thief)
            task = victim.assigned.pop(queued)
            rec = self.lanes.recs.pop(queued)
            prog.revoke(victim.slot, queued)
            if not victim.ready:
                victim.eager = False  # nothing more for it until it says it is ready
            rec.task = task._replace(tid=next(self.pool.tids))
            self.lanes.recs[rec.task.tid] = rec
            rec.worker = thief.slot
            self._send(thief, rec.task)
            self.counters.moved += 1

    def _slow_running(self) -> int:
        return sum(
            1 for w in list(self.pool.workers.values()) for t in w.assigned.values() if t.start > 0
        )


def running_longer_than(
    pool: WorkerPool, limit: float, workers: list[WorkerHandle]
) -> list[tuple[WorkerHandle, int, float]]:
    """(worker, tid, start) of each worker running a task of its own for over ``limit`` s."""
    prog = pool.progress
    now = time.monotonic()
    out = []
    for w in workers:
        tid, started = prog.tid[w.slot], prog.started[w.slot]
        if tid in w.assigned and now - started > limit:
            out.append((w, tid, started))
    return out
