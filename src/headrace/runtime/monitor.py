"""The loader's live measurements and the policies they feed, across epochs.

The scheduler calls these hooks from its thread; ``loader.stats()`` reads the results.
Policies themselves are pure (``headrace.planner``); this module only measures and applies.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headrace import resources
from headrace.errors import message_of
from headrace.pipeline.runner import StepTiming
from headrace.planner.executor import ExecutorDecision
from headrace.planner.queueing import describe as describe_queueing
from headrace.planner.queueing import hold_s, queue_depth
from headrace.planner.timeout import TimeoutPolicy, move_cost, remaining_after
from headrace.planner.workers import WorkerScaler
from headrace.profiler.stats import Profiler
from headrace.runtime.empty_epochs import EmptyEpochWarnings
from headrace.runtime.executor_auto import ExecutorProbes
from headrace.runtime.options import Options
from headrace.runtime.order_watch import why_broken
from headrace.runtime.output import batches_queued
from headrace.runtime.worker_scaling import WorkerScaling
from headrace.telemetry.stats import EpochStats, QueueSample, keep_latest
from headrace.user_frame import warn

if TYPE_CHECKING:
    from headrace.runtime.scheduler import Scheduler

log = logging.getLogger("headrace")

QUEUE_SAMPLE_S = 0.25
"""Seconds between two queue-depth samples in the stats timeline."""
QUEUE_HISTORY = 4096
"""Queue-depth samples kept (older ones are dropped: memory stays bounded)."""
TIMELINE_KEPT = 10_000
"""Changes of the worker count and of the timeout kept in the stats timelines."""
SKIP_LOG_EVERY = 100
"""A skipped sample is logged once, then once every this many."""
STARTING_PAUSE_S = 30.0
"""A worker not ready this long after its start (seconds) no longer holds the scaler's
decisions: a ``worker_init_fn`` that never returns froze ``num_workers="auto"`` for the run."""
REMAINING_UPDATE_S = 1.0
"""Seconds between two updates of the expected remaining step time workers read."""
REMAINING_MIN_SAMPLES = 16
"""Samples a profile holds before its own step medians give the remaining step times workers
read (``Monitor.known_step_p50`` until then)."""


class Monitor(WorkerScaling):
    """Feeds the timeout policy and the worker scaler, and keeps the timelines."""

    def __init__(self, options: Options, autoscale: bool, step_names: list[str] | None,
                 embedded: bool = False) -> None:
        self.options = options
        self.embedded = embedded  # steps inside load: a run without sizes has no step times
        self.executor: str | None = None
        """What runs the workers now (``use_executor``)."""
        self.profiler = Profiler(step_names) if step_names is not None and options.profile else None
        """Per-step statistics of the executed step order on the current executor (replaced
        when either changes)."""
        self.t0 = time.perf_counter()
        self.timeout = TimeoutPolicy(options.timeout)
        self._measured_bytes = 0  # the last finished sample's payload bytes a worker measured
        self._counters: Any = None  # the running epoch's scheduler counters (``on_tick``)
        self.scaler = WorkerScaler(options.autoscale) if autoscale else None
        # the latest changes (bounded: a loader may run for weeks)
        self.workers_timeline: deque[tuple[float, int]] = deque(maxlen=TIMELINE_KEPT)
        self.timeout_timeline: deque[tuple[float, float]] = deque(maxlen=TIMELINE_KEPT)
        self.queues: deque[QueueSample] = deque(maxlen=QUEUE_HISTORY)
        self.skipped_total = 0
        self.first_skip: str | None = None
        """The first line of the first error ``on_error="skip"`` dropped since an epoch last
        closed (its sample index, step and error), for the warning of an epoch that skipped
        every sample (``on_epoch_closed``)."""
        self.worker_restarts = 0
        self.samples_closed = 0  # samples the closed epochs delivered, all of them
        self.epochs: list[EpochStats] = []
        """Stats of epochs that ended (ran out or were abandoned), the latest
        ``telemetry.stats.EPOCHS_KEPT``."""
        self.epoch_listeners: list[Any] = []
        """Callables ``f()`` run when an epoch ends or is abandoned (the profile store)."""
        self.sample_listeners: list[Any] = []
        """Callables ``f(index, step_s, slow, timings)`` (the profiler attaches here)."""
        self.tick_listeners: list[Any] = []
        """Callables ``f(scheduler)`` run on every scheduler pass (remote workers, placement)."""
        self._last_queue = 0.0
        self._last_remaining = 0.0
        self._remaining_pool: Any = _no_pool  # weakref to the pool whose workers last got them
        self.stored_profile: Any = None
        """A stored ``PipelineProfile`` of this job (None: none): the scaler's numbers until
        this run has profiled 16 samples."""
        self.known_step_p50: dict[str, float] = {}
        """Median step times (s) by step name, known before the current profile holds
        ``REMAINING_MIN_SAMPLES`` samples: the run's previous profile (replaced by a new step
        order or executor, ``new_profile``), else a stored profile (``Planning``); empty: none.
        The steps of a new order are those of the old one, so each keeps its median until the
        new profile measures it: without them, workers read the steps left as unknown
        (``HandOff.remaining``'s ``inf``) and moved every late sample (docs/design.md)."""
        self.move_cost_s = 0.0
        """Training-process CPU seconds to forward one slow-lane sample to its next worker, from
        this epoch's moves (``planner.timeout.move_cost``)."""
        self.start_note: str | None = None
        """How ``num_workers="auto"`` chose its first count from a stored profile (explain())."""
        self._last_scale = time.perf_counter()
        self._starting = False  # a worker of the pool was not ready at the last tick
        self._warned_reseed = False
        self._empty_epochs = EmptyEpochWarnings()
        self.reseeded: tuple[str, ...] | None = None
        """The global generators a ``worker_init_fn`` seeded (``"random"``, ``"numpy"``,
        ``"torch"``), seen by the scheduler thread and not yet warned of (``warn_reseeded``);
        None: none."""
        self.probe_gil = False
        """``executor="auto"`` measures the GIL share of worker processes' steps."""
        self.executor_decision: ExecutorDecision | None = None
        """What ``executor="auto"`` chose (None: still measuring, or not auto)."""
        self._executor_probes = ExecutorProbes()  # what the probing pools measured
        self.meter: Any = None
        """The running epoch's ``EpochMeter`` (the consumer's side: samples taken, stall)."""
        self.cpu_use = resources.CpuUse() if autoscale else None  # its interval starts now
        self.order_broke: str | None = None
        """Why AutoOrder's step order running did not hold on a sample, in words
        (``runtime/order_watch.py``; the declared order runs from the next epoch boundary, and
        ``Planning`` clears it when it adopts an order); None: nothing seen."""

    def use_executor(self, executor: str) -> None:
        """Workers run on ``executor`` (``"processes"`` or ``"threads"``) from now on. A new
        executor starts a new profile, as a new step order does: a step's wall time in a
        thread includes its waits for the GIL, so the two measure different things."""
        if executor == self.executor:
            return
        self.executor = executor
        if self.profiler is not None:
            self.new_profile(self.profiler.step_names)

    def new_profile(self, step_names: Sequence[str]) -> None:
        """Profile ``step_names`` (the executed order) afresh, on the current executor, keeping
        the old profile's step medians by name in ``known_step_p50`` when it had measured
        ``REMAINING_MIN_SAMPLES`` samples; the workers' remaining step times are pushed again
        at the next tick."""
        old = self.profiler
        if old is not None and old.samples >= REMAINING_MIN_SAMPLES:
            self.known_step_p50 = {s.name: s.wall_p50 for s in old.report().steps}
        self.profiler = Profiler(step_names, executor=self.executor)
        self._remaining_pool = _no_pool

    def on_epoch_closed(self, stats: EpochStats, delivered_before: int = 0,
                        padded: bool = False) -> None:
        """The epoch of ``stats`` ended or was abandoned. ``delivered_before``: samples it
        delivered before its resume (0 for an epoch run from its start), which ``stats`` does
        not count. ``padded``: a DDP rank's padding batches come after it (their own warning
        says that skips left the rank short), so no batch reaching the loop is not said."""
        first, self.first_skip = self.first_skip, None
        self._empty_epochs.epoch_closed(stats, first, delivered_before, padded)
        self.samples_closed += stats.samples
        self.epochs.append(stats)
        if self.probe_gil:  # executor="auto": threads' first epoch is a trial
            self.executor_decision = self._executor_probes.after_epoch(
                self.executor or "processes", stats.wall_s, stats.samples_per_s,
                self.executor_decision)
        keep_latest(self.epochs)  # the cache's per-epoch lists drop the same ones
        for f in self.epoch_listeners:
            f()

    # -- hooks called by the scheduler thread --------------------------------------------------
    def on_sample(
        self, index: int, step_s: float, slow: bool, timings: list[StepTiming], bytes_in: int = 0
    ) -> None:
        self.timeout.observe(step_s, slow)
        if timings and timings[-1].bytes_out >= 0:
            self._measured_bytes = timings[-1].bytes_out
        self._profile(timings, bytes_in, total=step_s, partial=False)
        for f in self.sample_listeners:
            f(index, step_s, slow, timings)

    def on_sample_partial(self, index: int, timings: list[StepTiming], bytes_in: int = 0) -> None:
        self._profile(timings, bytes_in, total=None, partial=True)
        for f in self.sample_listeners:
            f(index, None, True, timings)

    def _profile(
        self, timings: list[StepTiming], bytes_in: int, total: float | None, partial: bool
    ) -> None:
        p = self.profiler
        if p is None or not timings:
            return
        if timings[0].bytes_out < 0:  # a worker measures sizes on some samples, times on all
            if not self.embedded:
                p.observe(timings, None, total=total, partial=partial)
            return
        p.observe(timings, [t.bytes_out for t in timings], bytes_in,
                  [t.changed for t in timings], [t.reshaped for t in timings], total=total,
                  partial=partial)

    def on_worker_reseeded(self, generators: tuple[str, ...]) -> None:
        """A ``worker_init_fn`` seeded global generators (scheduler thread): kept in
        ``reseeded`` for the training thread to warn of (:meth:`warn_reseeded`). Warned from
        this thread, the warning named the scheduler's line, not the script's."""
        if not self._warned_reseed and self.reseeded is None:
            self.reseeded = generators

    def warn_reseeded(self, seeded: bool) -> None:
        """Say once, at the user's ``next()``, that per-sample seeding overrides what
        ``worker_init_fn`` seeded (``reseeded``; torch's loader would have used those seeds).
        ``seeded``: the loader has a generator (``generator=`` or ``Options(seed=)``), so the
        run is reproducible already: torch's documented recipe (``seed_worker`` with
        ``generator=g``) was told to pass ``generator=``, which it did."""
        generators, self.reseeded = self.reseeded, None
        if generators is None or self._warned_reseed:
            return
        self._warned_reseed = True
        names = (f"the global generator of {generators[0]}" if len(generators) == 1 else
                 f"the global generators of {', '.join(generators[:-1])} and {generators[-1]}")
        if seeded:
            advice = ("The run is reproducible already: the base seed comes from the loader's "
                      "generator (generator= or Options(seed=)), as torch's worker seeds do, "
                      "so the seeding in worker_init_fn has no effect and can go")
        else:
            advice = ("Without generator= or Options(seed=), the base seed is drawn from "
                      "torch's global generator at each epoch, as torch draws its workers' "
                      "seeds: torch.manual_seed() before the loop, DataLoader(generator=...) "
                      "or Options(seed=...) makes a run reproducible")
        warn(f"headrace: worker_init_fn seeded {names}, but headrace "
             "re-seeds Python's, NumPy's and torch's global generators before each step from "
             "(base seed, epoch, sample index, step), so a sample's content does not depend "
             "on its worker: the seeds set in worker_init_fn do not reach __getitem__. "
             f"{advice} (README: differences from torch)")

    def on_order_broke(self, why: str) -> None:
        """A sample broke the premise of the step order running (``runtime/order_watch.py``)."""
        if self.order_broke is None:
            self.order_broke = why

    def read_order_watch(self, pool: Any) -> None:
        """What ``pool``'s workers saw of the premise of the order they ran
        (``Progress.order_broke``), read when an epoch releases the pool."""
        step = max(pool.progress.order_broke, default=0)
        if step and self.order_broke is None:
            self.order_broke = why_broken(pool.pipeline, step - 1)

    def on_worker_restart(self) -> None:
        self.worker_restarts += 1

    def on_skip(self, index: int, err: BaseException) -> None:
        self.skipped_total += 1
        if self.first_skip is None:
            self.first_skip = message_of(err).splitlines()[0]
        if self.skipped_total == 1 or self.skipped_total % SKIP_LOG_EVERY == 0:
            log.warning("headrace skipped sample %d (%d skipped so far): %s",
                        index, self.skipped_total, message_of(err).splitlines()[0])

    def slow_threshold_s(self) -> float:
        """The learned timeout in seconds (``inf`` while unknown), whether or not samples are
        handed off: a sample running longer is slow, and nothing should wait behind it."""
        return self.timeout.timeout_s

    @property
    def sample_bytes(self) -> int:
        """Payload bytes of the last finished sample whose size a worker measured (0: none
        yet), or the bytes the last sample read from a worker process took to send
        (``Counters.sent_bytes``, read live: also where sizes are not measured,
        ``profile=False``), whichever is more: ``queue_depth``'s cap on the bytes queued per
        worker."""
        sent = self._counters.sent_bytes if self._counters is not None else 0
        return max(self._measured_bytes, sent)

    def queue_depth(self) -> int:
        """Samples to assign to one worker process at once (``planner.queueing``): deeper when
        the typical sample is cheap, so their messages are shared; shallower for large ones."""
        return queue_depth(self.timeout.typical_s, self.sample_bytes)

    def hold_s(self, depth: int) -> float:
        """Seconds a worker may keep finished samples before it sends them, for a queue of
        ``depth`` (``planner.queueing.hold_s``, within a quarter of the work queued)."""
        return hold_s(depth, self.timeout.typical_s)

    def messages_line(self) -> str:
        """``explain()``'s line on how samples travel to and from worker processes."""
        last = self.epochs[-1] if self.epochs else None
        return describe_queueing(self.timeout.typical_s, self.queue_depth(),
                                 last.shared_samples if last is not None else None,
                                 last.samples if last is not None else None,
                                 self.sample_bytes)

    def on_tick(self, sched: Scheduler) -> None:
        pool = sched.pool
        self._counters = sched.counters
        self.move_cost_s = move_cost(sched.counters.forwarded, sched.counters.forward_cpu_s)
        now = time.perf_counter()
        # The steps left before the timeout: a new pool's workers that saw the timeout first
        # read them as unknown (inf) and would move any late sample meanwhile.
        if self.profiler is not None and (
            now - self._last_remaining >= REMAINING_UPDATE_S or self._remaining_pool() is not pool
        ):
            self._last_remaining = now
            self._push_remaining(pool)
        t = self.timeout.timeout_s if sched.spec.handoff else float("inf")
        # Every pool gets it: a new pool (each epoch's, unless persistent_workers) starts with
        # none. Pushed on changes alone, a fixed timeout moved no sample after the first epoch,
        # and a learned one none before its value next changed.
        if pool.handoff.timeout.value != t:
            pool.handoff.timeout.value = t
        if not self.timeout_timeline or self.timeout_timeline[-1][1] != t:
            self.timeout_timeline.append((self.now(), t))
        if now - self._last_queue >= QUEUE_SAMPLE_S:
            self._last_queue = now
            queued = batches_queued(sched.out)
            self.queues.append(
                QueueSample(self.now(), queued, sched.spec.batcher.ready_samples,
                            sched.in_flight, sched.slow_backlog)
            )
            if self.scaler is not None:
                self.scaler.observe_queue(queued / sched.spec.batches_in_flight())
        if self.scaler is not None:
            mono = time.monotonic()
            local = [w for w in list(pool.workers.values()) if not w.retiring and not w.external]
            if not local or len(pool.requests) or any(
                not w.ready and mono - w.started < STARTING_PAUSE_S for w in local
            ):
                # A worker still starting: its fork and imports, and the cores idling while it
                # initialises, say nothing of the load the pool puts on them (imagenet's first
                # window read as unsaturated and added a third worker on 2 cores). No decision
                # meanwhile (nor while one waits for the training thread to fork it); the next
                # one's window starts once every worker runs, or once one has been starting for
                # STARTING_PAUSE_S (a worker_init_fn that never returns froze the scaler).
                # Nor before the epoch's pool forked any: the scheduler ticks before the
                # training thread starts the pool, and a decision on no workers, over a window
                # of whatever the script did since the loader was built, asked for workers on
                # top of the pool's own start (initial=1 started 2 when the script paused
                # between the loader and its loop: tests/unit/test_scale_window.py).
                self._starting = True
            elif self._starting:
                self._starting = False
                self._last_scale = now
                assert self.cpu_use is not None
                self.cpu_use.read()  # a new CPU window...
                self.scaler.queue_avg = None  # ...and queue average (empty while they started)
            elif now - self._last_scale >= self.scaler.cfg.interval_s:
                self._last_scale = now
                self._autoscale(sched)
        if self.probe_gil and pool.probe_gil:  # executor="auto", a pool that measures
            self.executor_decision = self._executor_probes.decide(pool, self.executor_decision)
            if self.executor_decision is not None:
                pool.progress.probe_stop.value = 1  # (the GIL probes' wake-ups cost)
        for f in self.tick_listeners:
            f(sched)

    def _push_remaining(self, pool: Any) -> None:
        """Typical seconds from each step to the end: the sum of the remaining steps' median
        times (the current profile's once it holds ``REMAINING_MIN_SAMPLES`` samples, else
        ``known_step_p50``: the run's previous profile's or a stored one's), less what a
        move costs the training process (``move_cost_s``; ``planner.timeout.remaining_after``).
        Medians, not means: a step that is heavy on one sample in five (speech's HeavyStep) has
        a mean that would make every late sample look worth moving, although for four in five
        the steps left take nothing."""
        assert self.profiler is not None
        names = self.profiler.step_names
        if len(pool.handoff.remaining) != len(names) + 1:
            return
        if self.profiler.samples >= REMAINING_MIN_SAMPLES:
            typical = self.profiler.step_wall_p50s()  # not report(): 6x the CPU
        elif self.known_step_p50 and all(n in self.known_step_p50 for n in names):
            typical = [self.known_step_p50[n] for n in names]
        else:
            return
        for i, v in enumerate(remaining_after(typical, self.move_cost_s)):
            pool.handoff.remaining[i] = v
        self._remaining_pool = weakref.ref(pool)


def _no_pool() -> None:
    """What ``Monitor._remaining_pool`` holds before a push: no pool got the values yet."""
    return None
