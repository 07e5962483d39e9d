"""Adaptive CPU worker count (MinatoLoader §4.3, Formulas 1-2).

    workers = min(max_workers, max(min_workers, workers' + Δ))                       (1)
    Δ = clip(round(α·(1 − Q_size/Q_max) + β·(C_usage − θ_c)), −max_step, +max_step)  (2)

Q_size is a moving average of the ready-batch queue, Q_max its capacity, C_usage the machine's CPU
utilisation in [0, 1] and θ_c the CPU threshold. An empty queue or a busy CPU adds workers; a
full queue with an idle CPU removes them. headrace also caps the count by a memory budget:
``budget // memory_per_worker`` (a worker's private memory, ``runtime/worker_scaling.py``).

Three departures, two because the paper's max_workers is the core count and ours is not
(samples that mostly wait, on I/O or sleeps, need many more workers than cores: torch's best
on the speech workloads was 12 workers per core), one because its epochs are long:

* **Saturated cores add no workers.** At or above ``saturated_cpu`` machine utilisation, no
  worker is added beyond the cores: the cores, not the worker count, limit throughput, and a
  busy machine (another job, the training step) would otherwise read as "CPU high, queue
  empty: add" forever (measured: 2 → 16 workers on 2 cores while the demo trained its model).
* **Little's law jump.** Formula 2 moves by at most ``max_step`` a decision; from the cores to
  the 24 workers a sleep-heavy workload needs that takes ten decisions, most of a short epoch.
  When the queue is short of half full and the cores are not saturated, the count jumps to the
  workers that keep the consumer fed: λ·W, λ the samples per second the consumer takes when it
  does not wait, W a sample's mean wall time in a worker, times ``demand_margin``; with a
  known CPU share, at most the workers the cores can run (:func:`busy_workers`): λ·W counts
  the wait of CPU-bound samples for a core as work more workers would overlap, and no count
  of workers overlaps it.
* **The rest of the epoch caps what is added.** No decision adds workers beyond those the
  epoch's unfinished samples can keep busy (:func:`epoch_workers`: two samples a worker, the
  rule that caps a pool's start): a short epoch whose empty queue asked for more forked
  workers that its last samples could not keep busy.

Pure: the runtime measures, this decides.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

from headrace import resources
from headrace.planner import ranks
from headrace.planner.queueing import MIN_DEPTH


def available_cpus() -> int:
    """CPU cores this process may run on: its affinity, bounded by its cgroup's CPU quota
    (``headrace.resources``)."""
    return resources.available_cpus()


def rank_cpus() -> int:
    """Cores this process may plan workers for: :func:`available_cpus` divided among the
    data-parallel ranks of this node (``planner/ranks.py``)."""
    return ranks.cpu_share(available_cpus(), ranks.local_world_size())


AUTO_MAX_WORKERS_PER_CORE = 16
"""Hard cap of ``num_workers="auto"`` without ``max_workers``: workers per available core."""


DECISIONS_KEPT = 10_000
"""Scaling decisions a scaler keeps (one every ``interval_s`` for the loader's life)."""


@dataclasses.dataclass(frozen=True)
class AutoscaleConfig:
    """Settings of the worker scaler (used only with ``num_workers="auto"``).

    Attributes:
        initial: workers at start (``None``: the available cores, divided among the
            data-parallel ranks of the node: ``LOCAL_WORLD_SIZE``, see ``planner/ranks.py``).
        min_workers / max_workers: bounds. ``max_workers=None``: 2 × available cores, since
            workers often wait on I/O, raised once the profile shows how much of a sample's
            time is CPU: about ``cores / cpu_share`` workers keep the cores busy when samples
            mostly wait (sleeps, reads), up to :data:`AUTO_MAX_WORKERS_PER_CORE` × cores.
        alpha: sensitivity to an empty ready queue (workers per unit of emptiness).
        beta: sensitivity to CPU utilisation above ``cpu_threshold``.
        cpu_threshold: θ_c, utilisation (0..1) above which the CPU term turns positive.
        max_step: the clip of Δ (paper: 2).
        interval_s: seconds between two decisions.
        ema: weight of the newest queue sample in the moving average (0..1].
        memory_budget_bytes: total private memory (what they do not share with the training
            process) the workers may use (``None``: half of the memory
            available when the loader starts, divided among the node's data-parallel ranks).
        saturated_cpu: machine CPU utilisation (0..1) at or above which no worker is added
            beyond the cores (see the module docstring).
        demand_margin: factor on Little's law's λ·W workers when the count jumps to it.
    """

    initial: int | None = None
    min_workers: int = 1
    max_workers: int | None = None
    alpha: float = 2.0
    beta: float = 2.0
    cpu_threshold: float = 0.7
    max_step: int = 2
    interval_s: float = 1.0
    ema: float = 0.3
    memory_budget_bytes: int | None = None
    saturated_cpu: float = 0.9
    demand_margin: float = 1.25

    def __post_init__(self) -> None:
        if self.min_workers < 1:
            raise ValueError("min_workers must be >= 1")
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError("max_workers must be >= min_workers")
        if self.max_step < 1 or not 0 < self.ema <= 1 or self.interval_s <= 0:
            raise ValueError("max_step >= 1, 0 < ema <= 1 and interval_s > 0 required")

    def bounds(self, cpu_share: float | None = None) -> tuple[int, int]:
        """(min, max) workers. ``cpu_share``: CPU time ÷ wall time of a sample's steps, from
        the profile (``None``: not known yet)."""
        if self.max_workers is not None:
            hi = self.max_workers
        else:
            cores = rank_cpus()
            hi = 2 * cores
            if cpu_share is not None and cpu_share > 0:
                wanted = math.ceil(cores / cpu_share)
                hi = max(hi, min(AUTO_MAX_WORKERS_PER_CORE * cores, wanted))
        return self.min_workers, max(self.min_workers, hi)

    def slot_bound(self) -> int:
        """The most workers ``bounds`` can ever allow (the pool's slots)."""
        if self.max_workers is not None:
            return max(self.min_workers, self.max_workers)
        return max(self.min_workers, AUTO_MAX_WORKERS_PER_CORE * rank_cpus())

    def start_count(self, cpu_share: float | None = None, demand: int | None = None) -> int:
        """Workers to start with. Without ``initial``: the cores, or, when a stored profile
        gives ``cpu_share`` (CPU ÷ wall of a sample's steps), the workers that keep the cores
        busy, :func:`busy_workers`, within the bounds: a job whose samples mostly wait then
        starts near its steady count instead of growing to it during its first epoch
        (speech-3s: from 2 to about 28 workers, most of a 9 s epoch). ``demand``: Little's
        law's workers for the consumer the stored run measured (:func:`demand_workers`); no
        more than that start: on 16 cores, CPU-bound jobs whose consumer 5-8 workers keep fed
        started 16, and every worker beyond the need is forked and competes with the training
        process for nothing (measured 0.86-0.87x torch's fastest row there, against 1.03-1.04x
        with 8). The scaler adds workers when the queue empties."""
        lo, hi = self.bounds(cpu_share)
        if self.initial is not None:
            return min(hi, max(lo, self.initial))
        if cpu_share is not None and cpu_share > 0:
            n = busy_workers(rank_cpus(), cpu_share)
        else:
            n = rank_cpus()
        if demand is not None:
            n = min(n, demand)
        return min(hi, max(lo, n))


def busy_workers(cores: int, cpu_share: float) -> int:
    """Workers whose CPU demand comes nearest the ``cores``: ``cores / cpu_share`` rounded to
    the nearest count (at least 1), ``cpu_share`` being CPU ÷ wall of a sample's steps.

    Nearest, not up: on CPU-bound steps (share 0.97) rounding up asks for a third worker on 2
    cores, which can only share them, with the training process's own threads too; a count
    that leaves a little of the cores idle (2 × 0.97 here) is the better side to miss on, and
    the scaler adds a worker when the cores do idle (``next_worker_count``)."""
    return max(1, math.floor(cores / cpu_share + 0.5))


HELD_BY = ("draining", "unmeasured", "max_workers", "auto_max", "min_workers", "memory",
           "saturated", "epoch")
"""What can hold a decision's count away from what Formulas 1-2 (and Little's law) asked
(``ScaleDecision.held``): the epoch drains; a reading is not a number; the upper bound, the
user's ``max_workers`` or the automatic one; ``min_workers``; the memory cap; saturated cores;
the rest of the epoch."""


@dataclasses.dataclass(frozen=True)
class ScaleDecision:
    """One decision with the numbers behind it (for ``explain()`` and the stats timeline)."""

    current: int
    new: int
    delta: float
    queue_fill: float
    cpu_usage: float
    memory_cap: int | None
    """Workers the memory budget allows (None: not measured); named in :meth:`describe` only
    when it held the count."""
    demand_workers: int | None = None
    saturated: bool = False
    """Saturated cores held back workers the decision would otherwise have added."""
    epoch_cap: int | None = None
    """Workers the rest of the epoch could keep busy (:func:`epoch_workers`), when that held
    back what the decision added; None otherwise."""
    held: str | None = None
    """What held the count away from Formula 2's step (one of :data:`HELD_BY`; None: nothing,
    the count is the formula's, or Little's law's jump)."""
    bound: int | None = None
    """The number behind ``held``: the bound's workers (``max_workers``, ``auto_max``,
    ``min_workers``) or the cores (``saturated``); None otherwise."""

    def describe(self) -> str:
        verb = "kept" if self.new == self.current else ("added" if self.new > self.current else "removed")
        n = abs(self.new - self.current)
        what = f"{verb} {n} worker(s)" if n else f"kept {self.current} workers"
        demand = (f", the consumer needs ~{self.demand_workers} (λ·W)"
                  if self.demand_workers is not None else "")
        return (
            f"{what}: ready-queue fill {self.queue_fill:.2f}, CPU {self.cpu_usage:.2f}, "
            f"Δ={self.delta:+.2f}{demand}{self._held_text()}"
        )

    def _held_text(self) -> str:
        """The clause naming what held the count (empty when nothing did)."""
        return {
            None: "",
            "draining": ", not applied: the epoch is draining (nothing left to hand out; the "
                        "next epoch starts from this count)",
            "unmeasured": ", not applied: a reading is not a number",
            "max_workers": f", at max_workers ({self.bound})",
            "auto_max": f", at the upper bound ({self.bound}: max_workers=None, from the cores "
                        "and the samples' CPU share)",
            "min_workers": f", at min_workers ({self.bound})",
            "memory": f", memory allows {self.memory_cap}",
            "saturated": f", cores saturated: none added beyond the {self.bound} cores",
            "epoch": f", the rest of the epoch keeps {self.epoch_cap} busy",
        }[self.held]


def formula_delta(queue_fill: float, cpu_usage: float, cfg: AutoscaleConfig) -> float:
    """Formula 2 before rounding and clipping."""
    return cfg.alpha * (1.0 - queue_fill) + cfg.beta * (cpu_usage - cfg.cpu_threshold)


def consumer_rate(samples: int, busy_s: float, min_busy_s: float = 0.5) -> float | None:
    """Samples per second a training loop takes when it does not wait for data: ``samples``
    over ``busy_s``, the seconds it spent outside ``next()``'s waits (``None`` under
    ``min_busy_s`` seconds: too little measured)."""
    if samples <= 0 or busy_s < min_busy_s:
        return None
    return samples / busy_s


def demand_workers(consumer_rate: float | None, sample_wall_s: float | None,
                   margin: float) -> int | None:
    """Little's law: workers that keep a consumer taking ``consumer_rate`` samples/s fed when a
    sample spends ``sample_wall_s`` seconds in a worker, times ``margin`` (``None``: unknown)."""
    if not consumer_rate or not sample_wall_s or consumer_rate <= 0 or sample_wall_s <= 0:
        return None
    if math.isinf(consumer_rate):
        return None
    return max(1, math.ceil(consumer_rate * sample_wall_s * margin))


def epoch_workers(left: int | None, max_in_flight: int) -> int:
    """Workers an epoch can keep busy from here: its samples not finished (``left``: not yet
    given to a worker or given and not settled; None: unknown) or the samples allowed in
    flight (``max_in_flight``),
    whichever is fewer, over the ``MIN_DEPTH`` samples a worker holds (one running, one
    queued): more would hold none. The rule that caps a pool's start
    (``WorkerScaling.start_workers(most=)``), applied to the rest of the epoch at each
    decision (:func:`next_worker_count`'s ``epoch_cap``)."""
    at_once = max_in_flight if left is None else min(max_in_flight, left)
    return -(-max(0, at_once) // MIN_DEPTH)


def next_worker_count(
    current: int,
    queue_fill: float,
    cpu_usage: float,
    cfg: AutoscaleConfig,
    memory_cap: int | None = None,
    cpu_share: float | None = None,
    cores: int | None = None,
    demand: int | None = None,
    draining: bool = False,
    epoch_cap: int | None = None,
) -> ScaleDecision:
    """Formulas 1-2: the next worker count from queue fill (0..1) and CPU use (0..1).

    ``draining``: the epoch has nothing left to hand out (its last samples are running):
    the count is kept. Its queue fills and its CPU idles because the epoch ends, not because
    there are too many workers, and the next epoch starts from the count this one ends with.

    ``cpu_share``: CPU ÷ wall time of samples' steps (see ``AutoscaleConfig.bounds``).
    ``cores``: the cores the workers may use; with it, saturated cores add no worker beyond
    them. ``demand``: Little's law's workers (:func:`demand_workers`); with it, a short queue
    on unsaturated cores jumps there (both: see the module docstring).

    ``epoch_cap``: the workers the rest of the epoch can keep busy (:func:`epoch_workers`);
    no worker is added beyond it (a short epoch's last samples keep no new worker busy: its
    fork costs more than it runs). It removes none: the next epoch starts from the count this
    one ends with, and its own start is capped by its length."""
    if not (math.isfinite(queue_fill) and math.isfinite(cpu_usage)):
        # NaN would read as an empty queue or an idle CPU (max(0.0, nan) is 0.0): no decision
        return ScaleDecision(current, current, math.nan, queue_fill, cpu_usage, memory_cap,
                             demand, held="unmeasured")
    queue_fill = min(1.0, max(0.0, queue_fill))
    cpu_usage = min(1.0, max(0.0, cpu_usage))
    raw = formula_delta(queue_fill, cpu_usage, cfg)
    step = int(math.floor(raw + 0.5)) if raw >= 0 else -int(math.floor(-raw + 0.5))
    step = max(-cfg.max_step, min(cfg.max_step, step))
    if draining:
        return ScaleDecision(current, current, raw, queue_fill, cpu_usage, memory_cap, demand,
                             held="draining")
    lo, top = cfg.bounds(cpu_share)
    hi = top if memory_cap is None else max(lo, min(top, memory_cap))
    over: tuple[str, int] = (("memory", hi) if hi < top
                             else ("max_workers" if cfg.max_workers is not None else "auto_max", hi))

    def limit(want: int) -> tuple[int, str | None, int | None]:
        """``want`` within the bounds and the epoch cap: (count, what held it, its number)."""
        new = min(hi, max(lo, want))
        held, bound = over if want > hi else ("min_workers", lo) if want < lo else (None, None)
        if epoch_cap is not None and new > max(current, lo, epoch_cap):
            return max(current, lo, epoch_cap), "epoch", None
        return new, held, bound

    asked = step  # Formula 2's step, before saturated cores lower it
    if cores is not None and cpu_usage >= cfg.saturated_cpu and step > 0:
        step = max(0, min(step, cores - current))
    elif demand is not None and queue_fill < 0.5:
        runnable = demand  # λ·W, at most what the cores can run when the share is known
        if cpu_share is not None and cpu_share > 0 and cores is not None:
            runnable = min(demand, busy_workers(cores, cpu_share))
        step = max(step, runnable - current)
    new, held, bound = limit(current + step)
    if step < asked:  # saturated cores lowered it: name them only if that changed the count
        free, free_held, free_bound = limit(current + asked)
        held, bound = ("saturated", cores) if new < free else (free_held, free_bound)
    return ScaleDecision(current, new, raw, queue_fill, cpu_usage, memory_cap, demand,
                         held == "saturated", epoch_cap if held == "epoch" else None,
                         held, bound)


class WorkerScaler:
    """Keeps the moving average of the ready queue and decides every ``interval_s``."""

    def __init__(self, cfg: AutoscaleConfig) -> None:
        self.cfg = cfg
        self.queue_avg: float | None = None
        self.decisions: deque[ScaleDecision] = deque(maxlen=DECISIONS_KEPT)  # the latest

    def observe_queue(self, fill: float) -> None:
        """Feed one sample of the ready-queue fill (Q_size / Q_max, 0..1). A reading that is
        not a finite number is ignored: one NaN made the moving average NaN for good, read
        as an empty queue, and a worker was added at every decision."""
        if not math.isfinite(fill):
            return
        a = self.cfg.ema
        self.queue_avg = fill if self.queue_avg is None else a * fill + (1 - a) * self.queue_avg

    def decide(
        self,
        current: int,
        cpu_usage: float,
        memory_per_worker: float | None = None,
        memory_budget: float | None = None,
        cpu_share: float | None = None,
        cores: int | None = None,
        consumer_rate: float | None = None,
        sample_wall_s: float | None = None,
        draining: bool = False,
        epoch_cap: int | None = None,
    ) -> ScaleDecision:
        """Next count; ``memory_per_worker`` (a worker's private memory: what one more adds)
        and ``memory_budget`` in bytes cap it;
        ``cpu_share`` (CPU ÷ wall of samples' steps) raises the default upper bound;
        ``cores``, ``consumer_rate`` (samples/s the consumer takes when it does not wait)
        and ``sample_wall_s`` (a sample's mean seconds in a worker) feed the two departures
        of the module docstring; ``draining`` and ``epoch_cap`` (the workers the rest of the
        epoch can keep busy, :func:`epoch_workers`): see :func:`next_worker_count`."""
        cap = None
        if memory_per_worker and memory_budget:
            cap = max(1, int(memory_budget // memory_per_worker))
        fill = self.queue_avg if self.queue_avg is not None else 0.0
        demand = demand_workers(consumer_rate, sample_wall_s, self.cfg.demand_margin)
        d = next_worker_count(current, fill, cpu_usage, self.cfg, cap, cpu_share, cores, demand,
                              draining, epoch_cap)
        self.decisions.append(d)
        return d
