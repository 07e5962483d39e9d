"""``num_workers="auto"`` in the running loader: where a pool starts and, every scheduler tick,
what the worker scaler (``planner/workers.py``, MinatoLoader's Formulas 1-2) decides from what
the monitor measured. ``Monitor``'s half that scales (``runtime/monitor.py`` measures)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import psutil

from headrace import resources
from headrace.planner import ranks
from headrace.planner.workers import (
    WorkerScaler,
    consumer_rate,
    demand_workers,
    epoch_workers,
    rank_cpus,
)
from headrace.profiler.report import PipelineProfile, cpu_share

if TYPE_CHECKING:
    from headrace.profiler.stats import Profiler
    from headrace.runtime.lanes import Lanes
    from headrace.runtime.scheduler import Scheduler


class WorkerScaling:
    """The worker scaler's inputs and decisions (a base of ``Monitor``, which sets the
    attributes below)."""

    scaler: WorkerScaler | None
    profiler: Profiler | None
    stored_profile: PipelineProfile | None
    meter: Any
    cpu_use: Any
    epochs: Any
    workers_timeline: Any
    start_note: str | None
    executor: str | None
    t0: float
    """``time.perf_counter()`` when the loader was created."""
    _parked: WorkerScaler | None = None  # the scaler while a fixed num_workers is set

    @property
    def can_scale(self) -> bool:
        """The loader was built with ``num_workers="auto"`` (its scaler, running or parked)."""
        return self.scaler is not None or self._parked is not None

    def follow_auto(self, auto: bool) -> None:
        """``num_workers`` assigned after construction (``runtime/worker_count.py``): the
        scaler runs only while it is ``"auto"``; a fixed count parks it."""
        if auto and self.scaler is None:
            self.scaler, self._parked = self._parked, None
        elif not auto and self.scaler is not None:
            self._parked, self.scaler = self.scaler, None

    def now(self) -> float:
        """Seconds since the loader was created."""
        return time.perf_counter() - self.t0

    def record_workers(self, n: int) -> None:
        """Record ``n``, the loader's local workers now (``WorkerPool.own_workers``: remote
        ones are not counted), in ``workers_timeline`` where it changed."""
        if not self.workers_timeline or self.workers_timeline[-1][1] != n:
            self.workers_timeline.append((self.now(), n))

    def last_workers(self, default: int) -> int:
        """The local worker count last recorded (``default`` before any)."""
        return self.workers_timeline[-1][1] if self.workers_timeline else default

    def start_workers(self, default: int, most: int | None = None) -> int:
        """Where the next epoch's pool starts with ``num_workers="auto"``: the count the last
        epoch ended with; for the first, ``default``, or the count a stored profile says keeps
        the cores busy (``AutoscaleConfig.start_count``). ``most``: the workers the epoch can
        keep busy at once (its length or the in-flight bound, over the two samples a worker
        holds): a stored profile of steps that mostly wait (a CPU share near 0) asked for 16
        workers per core, and a 16-sample job started 32, its epochs 7-9x longer than with 2
        (an edge-case hunt)."""
        n = self._start_workers(default)
        if most is not None and self.scaler is not None:
            n = max(self.scaler.cfg.min_workers, min(n, most))
        return n

    def _start_workers(self, default: int) -> int:
        if self.workers_timeline or self.scaler is None or self.stored_profile is None:
            return self.last_workers(default)
        steps = self._profile_steps()
        share = self._cpu_share(steps)
        rate = self.stored_profile.consumer_rate if steps is not None else None
        demand = demand_workers(rate, self._sample_wall_s(steps), self.scaler.cfg.demand_margin)
        n = self.scaler.cfg.start_count(share, demand)
        # no worker's memory is measured yet: a forked worker reads its way towards the
        # training process's own memory (copy-on-read), so that stands in for one worker's
        own = worker_memory(None)
        cap = int(self.memory_budget() // own) if own else n
        start = max(min(n, cap), min(default, n), self.scaler.cfg.min_workers)
        self.start_note = _start_note(start, share, rate, demand,
                                      memory_cap=cap if cap < n else None)
        return start

    def _profile_steps(self) -> Any:
        """Step statistics of this run's profile once it has 16 samples, else of a stored
        profile of this job measured on this executor (or not saying which), else None.

        A profile stored by a run on worker threads reads a process pool's samples as mostly
        waiting (their GIL waits count as wall time, not CPU nor run queue): measured on 16
        cores, a thread run's imseg profile started the next process run at 52 workers."""
        if self.profiler is not None and self.profiler.samples >= 16:
            return self.profiler.report().steps
        stored = self.stored_profile
        if (stored is not None and stored.samples >= 16
                and stored.executor in (None, self.executor)):
            return stored.steps
        return None

    def _cpu_share(self, steps: Any = None) -> float | None:
        """A sample's CPU share on a core of its own (``profiler.report.cpu_share``: a share
        measured on busy cores would otherwise read low and ask for workers the cores cannot
        run) of ``steps`` (default: ``_profile_steps``; None: unknown)."""
        steps = self._profile_steps() if steps is None else steps
        return cpu_share(steps) if steps is not None else None

    @staticmethod
    def _sample_wall_s(steps: Any) -> float | None:
        """A sample's mean wall seconds in a worker from ``steps`` (None: unknown)."""
        return (sum(s.wall_mean for s in steps) or None) if steps is not None else None

    def _consumer_rate(self) -> float | None:
        """Samples per second the training loop takes when it does not wait for data, this
        epoch so far (None: under half a second of consumer time measured)."""
        m = self.meter
        if m is None:
            return None
        return consumer_rate(m.samples, time.perf_counter() - m.t_start - m.stall_s)

    def last_consumer_rate(self) -> float | None:
        """The training loop's rate (as :meth:`_consumer_rate`) over the last epoch, if it ran
        to its end (None otherwise, or too short): an epoch left early is closed at the next
        ``iter()`` or later, and the time between (validation, a break) is not the loop's."""
        if not self.epochs or not self.epochs[-1].finished:
            return None
        e = self.epochs[-1]
        return consumer_rate(e.samples, e.wall_s - e.stall_s)

    def memory_cap(self) -> int | None:
        """The workers the memory budget allowed at the scaler's last decision that measured
        its workers' memory (``ScaleDecision.memory_cap``: the budget, counting what the live
        workers held, over their mean private memory); None before any was measured, or
        without a scaler. FastFlow's offload estimate caps the local workers it counts on with
        it. Taken from that decision, not read now: with the workers alive (persistent ones)
        the memory available now leaves their own out, and read now it undercounted (a
        review)."""
        if self.scaler is None:
            return None
        return next((d.memory_cap for d in reversed(self.scaler.decisions)
                     if d.memory_cap is not None), None)

    def memory_budget(self, workers_use: float = 0.0) -> float:
        """Bytes the workers may use in all: ``AutoscaleConfig.memory_budget_bytes``, else
        ``ranks.worker_memory_budget`` of the memory available now and ``workers_use`` (bytes
        the workers hold already). Read at each decision: it was read once, so memory another
        process took later went unseen and the workers kept their count (a review's find)."""
        assert self.scaler is not None
        cfg_budget = self.scaler.cfg.memory_budget_bytes
        if cfg_budget is not None:
            return float(cfg_budget)
        return ranks.worker_memory_budget(resources.available_memory(), workers_use,
                                          ranks.local_world_size())

    def _autoscale(self, sched: Scheduler) -> None:
        assert self.scaler is not None
        pool = sched.pool
        live = [w for w in list(pool.workers.values()) if not w.retiring and not w.external]
        used = []
        for w in live:
            if w.process.pid is None:
                continue  # a worker thread: its memory is the training process's
            size = worker_memory(w.process.pid)
            if size is not None:
                used.append(size)
        per_worker = sum(used) / len(used) if used else None
        steps = self._profile_steps()  # one report for both numbers
        assert self.cpu_use is not None
        d = self.scaler.decide(len(live), self.cpu_use.read(), per_worker,
                               self.memory_budget(sum(used)), self._cpu_share(steps),
                               rank_cpus(),
                               self._consumer_rate(), self._sample_wall_s(steps),
                               draining=sched.lanes.exhausted and not sched.lanes.fresh,
                               epoch_cap=epoch_cap(sched.lanes))
        if d.new > d.current:  # forked by the training thread at its next batch (forks.py)
            for _ in range(d.new - d.current):
                if not pool.request_worker(num_workers=d.new):
                    break
        elif d.new < d.current:
            for w in sorted(live, key=lambda w: len(w.assigned))[: d.current - d.new]:
                pool.retire(w)
        self.record_workers(pool.own_workers)  # the local count it decided on (``live``)


def epoch_cap(lanes: Lanes) -> int:
    """The workers the rest of the epoch ``lanes`` tracks can keep busy
    (``planner.workers.epoch_workers``): the cap on the scaler's additions, by the rule that
    caps the pool's start. Its samples not finished are those not yet given to a worker
    (``lanes.fresh_left``, as ``Lanes.near_end`` counts them: the sampler's ``__len__`` a hint)
    and those given and not settled (waiting, running, in the slow lane)."""
    fresh = lanes.fresh_left()
    left = None if fresh is None else fresh + max(0, lanes.pulled - lanes.settled - len(lanes.fresh))
    return epoch_workers(left, lanes.spec.max_in_flight)


def _start_note(n: int, share: float | None, rate: float | None, demand: int | None,
                memory_cap: int | None = None) -> str:
    """``explain()``'s line on the first count (``Monitor.start_workers``)."""
    parts = []
    if share is not None:
        parts.append(f"CPU share {share:.2f} of a sample's steps")
    if rate is not None and demand is not None:
        parts.append(f"the training loop took {rate:.0f} samples/s, which ~{demand} workers "
                     "keep fed (λ·W)")
    if memory_cap is not None:
        parts.append(f"the memory budget allows {memory_cap}")
    why = "; ".join(parts) if parts else "nothing measured for this executor"
    return f"started at {n} from a stored profile ({why})"


def worker_memory(pid: int | None) -> int | None:
    """Bytes a worker process ``pid`` (None: this, the training process) adds to the machine's
    memory: its private memory (``resources.private_memory``), else its RSS; None where neither
    can be read (it exited). The RSS also counts pages a forked worker shares with the training
    process: a dataset holding a 1 GB array never written read as 1 GB a worker, and
    ``num_workers="auto"`` ran 1 worker in a 3 GB cgroup where torch's 16 fitted (a bug hunt)."""
    size = resources.private_memory("self" if pid is None else pid)
    if size is not None:
        return size
    try:
        return int((psutil.Process() if pid is None else psutil.Process(pid)).memory_info().rss)
    except (psutil.Error, ValueError):
        return None
