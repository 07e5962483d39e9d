"""Performance yardsticks: what a loader could achieve on the same sampler order and costs.

Two numbers put a measured wall time in perspective (ARCHITECTURE.md, "Performance yardsticks"):

- the **work-conserving bound**, ``max(total worker-seconds / workers, consumer step × batches)``:
  no loader with that many workers and that consumer can finish sooner, whatever its order;
- the **ideal pipeline**: a zero-overhead, sample-level loader simulated on the same sampler order
  with the measured per-sample costs. Workers take samples in sampler order as they free up, a
  batch is ready when its last sample is, the consumer takes batches one after another. It includes
  the fill and drain no online scheduler avoids in a first epoch, so ``wall / ideal`` measures a
  loader's own overhead (1.00 = none).

Both are pure functions of their inputs: no processes, no clocks. Every time is in seconds,
measured from the moment the epoch starts (all workers idle, nothing prefetched).
"""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "IdealResult",
    "ideal_pipeline_time",
    "num_batches",
    "simulate_ideal",
    "work_conserving_bound",
]


@dataclass(frozen=True)
class IdealResult:
    """The ideal pipeline's schedule for one epoch. Every time is in seconds from the epoch start.

    Attributes:
        end_s: when the consumer finishes its last batch: the ideal epoch wall time
            (what ``ideal_pipeline_time`` returns). Compare a loader's measured wall time with it.
        batch_ready_s: per batch, when its last sample finished on a worker.
        batch_start_s: per batch, when the consumer started it (``max(ready, previous end)``).
        consumer_stall_s: total time the consumer waited for data, the first batch's fill
            included. ``consumer_stall_s / end_s`` is the ideal stall fraction: a loader can not
            stall less on this order with these costs.
        workers_end_s: when the last worker finished its last sample (the workers' makespan).
        worker_busy_s: sum of the processed samples' costs (worker-seconds); samples that
            ``drop_last`` drops are not processed and not counted.
        workers: number of workers simulated.
        consumer_step_s: consumer time per batch.
    """

    end_s: float
    batch_ready_s: tuple[float, ...]
    batch_start_s: tuple[float, ...]
    consumer_stall_s: float
    workers_end_s: float
    worker_busy_s: float
    workers: int
    consumer_step_s: float

    @property
    def n_batches(self) -> int:
        """Number of batches the consumer took."""
        return len(self.batch_ready_s)

    @property
    def stall_fraction(self) -> float:
        """Share of the ideal wall time the consumer waited for data, in [0, 1] (0 if empty)."""
        return self.consumer_stall_s / self.end_s if self.end_s > 0 else 0.0

    @property
    def worker_utilization(self) -> float:
        """Busy worker-seconds ÷ (workers × end_s), in [0, 1]: how loaded the workers were."""
        return self.worker_busy_s / (self.workers * self.end_s) if self.end_s > 0 else 0.0


def num_batches(n_samples: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches an epoch of ``n_samples`` makes, as torch's ``BatchSampler`` counts them."""
    _check_positive("batch_size", batch_size)
    if n_samples < 0:
        raise ValueError(f"n_samples must be >= 0, got {n_samples}")
    return n_samples // batch_size if drop_last else math.ceil(n_samples / batch_size)


def simulate_ideal(
    order: Sequence[int],
    cost: Mapping[int, float] | Sequence[float],
    batch_size: int,
    workers: int,
    consumer_step_s: float,
    drop_last: bool = False,
) -> IdealResult:
    """Simulate the zero-overhead sample-level loader on one epoch.

    Args:
        order: dataset indices in the order the sampler yields them (one epoch).
        cost: per-sample cost in seconds of worker time (load plus every step, as measured
            while the sample ran), looked up as ``cost[index]``: a sequence indexed by dataset
            index or a mapping from index to seconds.
        batch_size: samples per batch; batch ``k`` is ``order[k*batch_size:(k+1)*batch_size]``.
        workers: number of workers, each processing one sample at a time.
        consumer_step_s: consumer (accelerator) time per batch, in seconds.
        drop_last: drop the incomplete last batch; its samples are never processed, as with
            torch's ``BatchSampler(drop_last=True)``.

    Workers start idle at time 0; whenever one frees up it takes the next sample in sampler
    order (an event simulation over a heap of worker free times). Nothing bounds the samples
    in flight or buffered: this is the best any loader that starts samples in sampler order can
    do. A loader that started samples out of order (long ones first) could beat it; none of the
    compared loaders does.
    """
    _check_positive("batch_size", batch_size)
    _check_positive("workers", workers)
    if consumer_step_s < 0 or math.isnan(consumer_step_s):
        raise ValueError(f"consumer_step_s must be >= 0 seconds, got {consumer_step_s}")
    n_batch = num_batches(len(order), batch_size, drop_last)
    n_used = min(len(order), n_batch * batch_size)

    free = [0.0] * workers  # min-heap of the times each worker becomes free
    ready: list[float] = []
    busy = 0.0
    batch_end = 0.0
    for pos in range(n_used):
        c = float(cost[order[pos]])
        if c < 0 or math.isnan(c):
            raise ValueError(f"cost of sample {order[pos]} must be >= 0 seconds, got {c}")
        done = free[0] + c  # the earliest-free worker takes it
        heapq.heapreplace(free, done)
        busy += c
        batch_end = max(batch_end, done)
        if (pos + 1) % batch_size == 0 or pos + 1 == n_used:
            ready.append(batch_end)
            batch_end = 0.0

    starts: list[float] = []
    end = 0.0
    stall = 0.0
    for r in ready:
        start = max(r, end)
        stall += start - end
        starts.append(start)
        end = start + consumer_step_s
    return IdealResult(
        end_s=end,
        batch_ready_s=tuple(ready),
        batch_start_s=tuple(starts),
        consumer_stall_s=stall,
        workers_end_s=max(free),
        worker_busy_s=busy,
        workers=workers,
        consumer_step_s=consumer_step_s,
    )


def ideal_pipeline_time(
    order: Sequence[int],
    cost: Mapping[int, float] | Sequence[float],
    batch_size: int,
    workers: int,
    consumer_step_s: float,
    drop_last: bool = False,
) -> float:
    """Ideal epoch wall time in seconds: :func:`simulate_ideal` ``(...).end_s``.

    A measured wall time divided by this number is the loader's own overhead factor
    (1.00 = none; torch's DataLoader typically shows 1.2-1.5 on heavy-tailed workloads).
    """
    return simulate_ideal(order, cost, batch_size, workers, consumer_step_s, drop_last).end_s


def work_conserving_bound(
    costs: Sequence[float],
    workers: int,
    consumer_step_s: float,
    n_batches: int,
) -> float:
    """Lower bound in seconds on any loader's epoch time: ``max(sum(costs)/workers, step × batches)``.

    Args:
        costs: per-sample costs in seconds of worker time, for the samples the epoch processes.
        workers: number of workers sharing that work.
        consumer_step_s: consumer time per batch, in seconds.
        n_batches: batches the consumer takes.

    The first term is the time the workers need if none is ever idle, the second the time the
    consumer needs if it never waits. A loader can reach it only with perfect overlap and no
    fill or drain, so ``wall / bound`` is >= 1 and includes the unavoidable fill and drain;
    ``ideal_pipeline_time`` is never below it.
    """
    _check_positive("workers", workers)
    if consumer_step_s < 0 or n_batches < 0:
        raise ValueError("consumer_step_s and n_batches must be >= 0")
    return max(math.fsum(costs) / workers, consumer_step_s * n_batches)


def _check_positive(name: str, value: int) -> None:
    try:
        ok = operator.index(value) >= 1
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
