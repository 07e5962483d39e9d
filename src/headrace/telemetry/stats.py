"""Statistics a loader reports through ``loader.stats()``.

How to read them: ``stall_s`` is time the training loop spent waiting inside ``iter()`` and
``next()``; a stall
fraction (stall ÷ wall) near 0 means the input pipeline keeps up, near 1 that the accelerator
mostly waits for data. ``slow_samples`` were handed to the slow lane after exceeding the learned
timeout. ``main_cpu_per_batch_ms`` is CPU time the training process spent in headrace (its
scheduler thread and ``next()``), per batch.
"""

from __future__ import annotations

import dataclasses

EPOCHS_KEPT = 1000
"""Epochs whose statistics a loader keeps (the latest; about 2 KB each): ``next(iter(loader))``
once per step starts an epoch per step, and a list kept for each grew without end."""


def keep_latest(history: list, kept: int | None = None) -> None:
    """Drop the oldest entries of ``history`` beyond the latest ``kept`` (``EPOCHS_KEPT``)."""
    kept = EPOCHS_KEPT if kept is None else kept
    if len(history) > kept:
        del history[: len(history) - kept]


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """What the sample cache did in one epoch (``Options(cache=...)``, ``headrace.cache``).

    Attributes:
        lookups: fresh samples looked up (one lookup covers every tier).
        hits: lookups that found a cached form; ``hits / lookups`` is the hit rate.
        hits_by_tier: hits per form (``"encoded"``, ``"decoded"``, ``"augmented"``).
        inserts: forms stored (at most one per sample run).
        uncacheable: forms not stored because the raw format cannot hold them (a type other
            than arrays, tensors, numbers, strings, bytes and tuples/lists/dicts of them).
        full: sample runs that stored no form because their tiers' budgets were full
            (nothing stale to evict): refused by the cache (with the memory backend's shards,
            the share of the shard the key falls in), or, once a worker was refused, not tried
            again for the rest of the epoch; once a run, however many of its forms were kept
            out, and not where it stored a less processed form instead. With a budget smaller
            than the forms, ``lookups - hits - inserts`` per epoch (less uncacheable forms and
            errors).
        errors: backend failures (or lookups while a failed backend is left alone for a
            moment); each such sample ran uncached.
        not_worth: tier lookups not made because they cost more than computing the form
            saves, times the share of this epoch's recent lookups of the tier that found one
            (both measured per tier; one in 32 is still made, to keep measuring).
        not_stored: forms not stored because the steps they save take less than three
            times encoding them (a copy of their bytes); one in 32 is still stored. Counted
            before ``drew``: such a form counts here whether a step before it drew or not
            (a run storing no form is not watched for draws), as do the unseeded forms after
            a hand-off of such a run (it may have drawn: not stored where it ends either).
        drew: forms the rule above would have stored, not stored because a step up to theirs
            drew from Python's, NumPy's or torch's global random generator (not declared
            ``random=True``): such a form differs from epoch to epoch, so it is not kept as
            one every epoch reads.
        bytes_by_tier: bytes held per tier when the numbers were taken (all epochs' entries).
        budget_by_tier: each tier's share of the budget (bytes).
        substituted: (ODS, ``Cache(ods=True)``) positions filled by a cached sample the job
            had not seen this epoch in place of the sample the sampler asked for, which was
            not cached (it comes later in the epoch). 0 without ODS.
        jobs: (ODS) live jobs sharing the cache at the epoch's last request, this one
            included; 0 without ODS.
    """

    lookups: int
    hits: int
    hits_by_tier: dict[str, int]
    inserts: int
    uncacheable: int
    full: int
    errors: int
    not_worth: int = 0
    not_stored: int = 0
    drew: int = 0
    bytes_by_tier: dict[str, int] = dataclasses.field(default_factory=dict)
    budget_by_tier: dict[str, int] = dataclasses.field(default_factory=dict)
    substituted: int = 0
    jobs: int = 0

    @property
    def hit_rate(self) -> float:
        """hits ÷ lookups (0 when nothing was looked up)."""
        return self.hits / self.lookups if self.lookups else 0.0


@dataclasses.dataclass(frozen=True)
class EpochStats:
    """One epoch (possibly still running).

    Attributes:
        epoch: epoch number (0-based, counted by the loader).
        wall_s: seconds from ``iter(loader)`` to the last batch (or to now), the time inside
            ``iter()`` (drawing the order, planning, forking workers) included.
        stall_s: seconds the training loop waited for the loader: inside ``iter(loader)``,
            and for a batch inside ``next()``; ``wall_s - stall_s`` is the loop's own time.
        batches / samples: yielded so far.
        samples_per_s: samples ÷ wall_s.
        fast_samples / slow_samples: finished in the fast lane / handed off to the slow lane.
        skipped_samples: dropped by ``on_error="skip"``.
        retried_samples: re-run after their worker died.
        main_cpu_per_batch_ms: training-process CPU spent in headrace per batch (ms).
        finished: the epoch ran to its end.
        moved_samples: samples that waited on a worker behind a slow sample and were given
            to an idle worker instead (delivered once; the old worker may still run it,
            and its result is dropped: see ``Dispatcher._steal``).
        failed_samples: samples whose error was raised in the training loop
            (``on_error="raise"``; the epoch went on). Not delivered: a resume retries them.
        cache: what the sample cache did this epoch (``None``: no cache).
        shared_samples: samples that reached the training process in a message shared with
            others (cheap samples: ``planner/queueing.py``).
        dropped_samples: samples that ran and were left out because ``drop_last`` forbids a
            short batch: with batches regrouped (``in_order=False``), skipped or failed samples
            leave the epoch's last batch short, and every batch stays ``batch_size`` long (the
            sampler's own ``drop_last`` tail never runs and is not counted here).
    """

    epoch: int
    wall_s: float
    stall_s: float
    batches: int
    samples: int
    samples_per_s: float
    fast_samples: int
    slow_samples: int
    skipped_samples: int
    retried_samples: int
    main_cpu_per_batch_ms: float
    finished: bool
    moved_samples: int = 0
    failed_samples: int = 0
    cache: CacheStats | None = None
    shared_samples: int = 0
    dropped_samples: int = 0

    @property
    def stall_fraction(self) -> float:
        """stall_s ÷ wall_s (0: never waited for data)."""
        return self.stall_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class QueueSample:
    """Queue depths at time ``t`` (seconds since the loader was created).

    ``ready_batches``: collated batches waiting for the training loop (occupancy near 0: the
    loop is starved); ``ready_samples``: finished samples not yet in a batch; ``in_flight``:
    samples dispatched and not yet yielded; ``slow_backlog``: handed-off samples waiting.
    """

    t: float
    ready_batches: int
    ready_samples: int
    in_flight: int
    slow_backlog: int


@dataclasses.dataclass(frozen=True)
class LoaderStats:
    """Everything ``loader.stats()`` returns.

    Attributes:
        epochs: one entry per epoch started (the latest ``EPOCHS_KEPT``, 1000), the last
            possibly running; a map-style dataset's only: over an ``IterableDataset`` torch's
            own iterator runs the epoch and none is recorded (empty; ``workers`` is kept).
        timeout_s: current hand-off timeout in seconds (``inf`` while warming up, and
            always over an IterableDataset: no sample of it is handed off).
        timeout_percentile: percentile behind it (75, or 90 after a fallback); ``nan`` for a
            fixed timeout (``TimeoutConfig(fixed_s=...)``): no percentile is behind it.
        workers: current number of worker processes (over an IterableDataset, those of
            torch's running or persistent iterator); remote ones once Ray placed them.
        workers_timeline: (seconds since creation, local workers) at every change: the
            loader's own worker processes or threads, those asked for and not started yet
            included; the count ``num_workers="auto"`` adapts and the next epoch starts from.
            Remote workers are not in it (``workers`` counts them once placed).
        timeout_timeline: (seconds since creation, timeout s) at every change.
        queues: sampled queue depths (bounded history).
        worker_restarts: worker processes replaced after dying.
        timeout_fallback_from: while the fallback holds, the configured percentile it replaced
            (more samples went slow over it than it implies, beyond chance); ``None``: none.
    """

    epochs: tuple[EpochStats, ...]
    timeout_s: float
    timeout_percentile: float
    workers: int
    workers_timeline: tuple[tuple[float, int], ...]
    timeout_timeline: tuple[tuple[float, float], ...]
    queues: tuple[QueueSample, ...]
    worker_restarts: int
    timeout_fallback_from: float | None = None

    @property
    def last(self) -> EpochStats | None:
        return self.epochs[-1] if self.epochs else None

    def __str__(self) -> str:
        """A few lines for ``print(loader.stats())``: the loader's state, then the first and
        the latest three epochs (``repr()`` still shows every field, queue samples included)."""
        if self.timeout_s == float("inf"):
            timeout = "none yet (warming up, or an IterableDataset)"
        elif self.timeout_percentile != self.timeout_percentile:  # nan: a fixed timeout
            timeout = f"{1000 * self.timeout_s:.1f} ms (fixed)"
        else:
            timeout = f"{1000 * self.timeout_s:.1f} ms ({self.timeout_percentile:g}th percentile)"
        lines = [f"LoaderStats: {len(self.epochs)} epoch(s) recorded, {self.workers} worker(s) "
                 "now (0 between epochs unless they persist), "
                 f"{self.worker_restarts} worker restart(s), hand-off timeout {timeout}"]
        shown = list(self.epochs[:1]) + list(self.epochs[max(1, len(self.epochs) - 3):])
        for k, e in enumerate(shown):
            if k == 1 and e.epoch > shown[0].epoch + 1:
                lines.append(f"  ... {e.epoch - shown[0].epoch - 1} epoch(s) not shown")
            lines.append("  " + _epoch_line(e))
        return "\n".join(lines)


def _epoch_line(e: EpochStats) -> str:
    """One epoch in one line: samples, wall seconds, samples/s, stall share, lanes, cache."""
    state = "" if e.finished else " (unfinished: running, or stopped part-way)"
    line = (f"epoch {e.epoch}{state}: {e.samples} samples in {e.batches} batches, "
            f"{e.wall_s:.2f} s, {e.samples_per_s:.1f} samples/s, stall {e.stall_fraction:.0%}, "
            f"{e.fast_samples} fast / {e.slow_samples} slow")
    extra = [(n, v) for n, v in (("skipped", e.skipped_samples), ("failed", e.failed_samples),
                                 ("retried", e.retried_samples)) if v]
    line += "".join(f", {v} {n}" for n, v in extra)
    if e.cache is not None:
        line += f", cache hits {e.cache.hits} of {e.cache.lookups} ({e.cache.hit_rate:.0%})"
    return line
