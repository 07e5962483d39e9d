"""Streaming per-step statistics with bounded memory, and the profile report they produce.

The runtime feeds a :class:`Profiler` one finished sample at a time (``observe``) with what the
workers measured around each step: wall and CPU seconds (``StepTiming``, on every sample) and
the payload bytes of each step's output (``sizes.payload_bytes``, on the samples a worker
measures sizes on: its first 64, then one in 8; ``runtime/worker.py``). ``report()`` turns the
accumulated state into a frozen, JSON round-trippable :class:`PipelineProfile` (defined in
``report``, re-exported here), which the planner reads and the profile store keeps. Memory is
O(steps x reservoir), whatever the number of samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING

import numpy as np

from headrace.profiler.estimators import Moments, Quantiles
from headrace.profiler.report import PROFILE_SCHEMA, TOTAL_GRID, PipelineProfile, StepStats

if TYPE_CHECKING:
    from headrace.pipeline.runner import StepTiming

__all__ = [
    "PROFILE_SCHEMA",
    "TIMES_ALL",
    "TIMES_EVERY",
    "TOTAL_GRID",
    "Moments",
    "PipelineProfile",
    "Profiler",
    "Quantiles",
    "StepStats",
]

TIMES_ALL = 2048
"""A profile keeps every record observed by its times alone (most samples from workers) until it
holds this many samples (the quantile reservoir's default size; AutoOrder's 300 come first)..."""
TIMES_EVERY = 8
"""...then one such record in this many: each kept costs the training process 1.5-2.7 µs (3-7
steps, a 2-core VM), one passed over 0.5 µs, so in the long run a sample costs it 0.6-0.7 µs
more than when these records were dropped (as the workers' own subsampling of sizes keeps their
cost down). Records with sizes are always kept, so from then on they weigh more in the step
times' means and quantiles than their share of samples (a worker sizes one sample in 8: about
half of the records kept); their times include the few µs a step the sizing costs."""


class _StepAccumulator:
    __slots__ = ("bytes_in", "bytes_out", "cpu", "inflation", "queued", "reshapes", "type_changes",
                 "unflagged", "wall")

    def __init__(self, capacity: int, seed: int) -> None:
        self.wall = Quantiles(capacity, seed)
        self.inflation = Quantiles(capacity, seed + 1)
        self.cpu = Moments()
        self.queued = Moments()
        self.bytes_in = Moments()
        self.bytes_out = Moments()
        self.type_changes = 0
        self.reshapes = 0  # records whose output's dtype/shape signature differed from the input's
        self.unflagged = 0  # records observed without that flag

    def add_columns(
        self, wall: np.ndarray, cpu: np.ndarray, bin_: np.ndarray, bout: np.ndarray,
        queued: np.ndarray,
    ) -> None:
        """Per-sample columns: wall, cpu and run-queue seconds, input and output bytes."""
        self.wall.add_many(wall)
        self.cpu.add_many(cpu)
        self.queued.add_many(queued)
        self.bytes_in.add_many(bin_)
        self.bytes_out.add_many(bout)
        has_in = bin_ > 0
        self.inflation.add_many(bout[has_in] / bin_[has_in])

    def merge(self, other: _StepAccumulator) -> None:
        self.wall.merge(other.wall)
        self.inflation.merge(other.inflation)
        self.cpu.merge(other.cpu)
        self.queued.merge(other.queued)
        self.bytes_in.merge(other.bytes_in)
        self.bytes_out.merge(other.bytes_out)
        self.type_changes += other.type_changes
        self.reshapes += other.reshapes
        self.unflagged += other.unflagged

    def add_times(self, wall: np.ndarray, cpu: np.ndarray) -> None:
        """Per-sample wall and CPU seconds of samples whose sizes were not measured."""
        self.wall.add_many(wall)
        self.cpu.add_many(cpu)

    def stats(self, name: str) -> StepStats:
        n = self.wall.count
        if n == 0:
            return StepStats(name, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, None, None, None, None, None,
                             sized=0)
        p50, p90 = self.wall.quantiles([0.5, 0.9])
        bin_, bout = self.bytes_in.mean, self.bytes_out.mean
        infl = self.inflation
        has_infl = infl.count > 0
        p10i, p90i = infl.quantiles([0.1, 0.9]) if has_infl else (None, None)
        return StepStats(
            name=name,
            count=n,
            wall_mean=self.wall.mean,
            wall_p50=p50,
            wall_p90=p90,
            cpu_mean=self.cpu.mean,
            queued_mean=self.queued.mean,
            bytes_in_mean=bin_,
            bytes_out_mean=bout,
            inflation=bout / bin_ if bin_ > 0 else None,
            inflation_mean=infl.mean if has_infl else None,
            inflation_std=infl.std if has_infl else None,
            inflation_p10=p10i,
            inflation_p90=p90i,
            type_changes=self.type_changes,
            sized=self.bytes_out.count,
            reshapes=self.reshapes if self.unflagged == 0 else None,
        )


class Profiler:
    """Accumulates per-step measurements of finished samples; ``report()`` summarises them.

    ``observe`` only queues the sample; every ``batch`` samples the queue is folded into the
    statistics column-wise with numpy, so the main process pays about 6 µs per 6-step sample
    in all (measured on a 2-core cloud VM), 1.5-2.7 µs for a 3-7-step sample observed by its
    times alone (``bytes_out=None``, most samples from workers; ``TIMES_ALL``). Not thread-safe: the runtime
    calls it from one thread of the main process with the records workers send back.
    ``StepTiming.step`` indexes ``step_names``.
    """

    def __init__(
        self, step_names: Sequence[str], *, reservoir: int = 2048, seed: int = 0, batch: int = 256,
        executor: str | None = None,
    ) -> None:
        self.step_names: tuple[str, ...] = tuple(step_names)
        self.executor = executor
        """What runs the samples observed (``PipelineProfile.executor``)."""
        n = len(self.step_names)
        self._steps = [_StepAccumulator(reservoir, seed + 2 * i) for i in range(n)]
        self._total = Quantiles(reservoir, seed + 2 * n)
        # complete samples (every step, in order) as columns; others as their raw records
        self._full: list[tuple[list[float], list[float], list[float], Sequence[int], int,
                               float | None]] = []
        self._other: list[tuple[Sequence[StepTiming], Sequence[int] | None, int, float | None,
                                bool]] = []
        # complete samples observed by their times alone (no sizes), their records kept as they
        # came (turned into columns at the flush: the cheapest path, taken by most samples)
        self._timed: list[tuple[Sequence[StepTiming], float | None]] = []
        self._pending_samples = 0
        self._unsized = 0  # records observed without sizes, kept or not
        self._batch = max(1, batch)

    @property
    def samples(self) -> int:
        """Samples observed so far (e.g. plan AutoOrder once this reaches ~300, as Pecan does)."""
        return self._total.count + self._pending_samples

    def observe(
        self,
        timings: Sequence[StepTiming],
        bytes_out: Sequence[int] | None,
        bytes_in: int = 0,
        changes_type: Sequence[bool] | None = None,
        reshapes: Sequence[bool] | None = None,
        *,
        total: float | None = None,
        partial: bool = False,
    ) -> None:
        """Record one finished sample (or, with ``partial``, a segment of one).

        Args:
            timings: the sample's step records in execution order (wall and CPU seconds);
                concatenate the segments of a sample resumed in the slow lane, so that its
                total time is complete.
            bytes_out: payload bytes of each step's output, aligned with ``timings``;
                ``None`` when they were not measured on this sample (a worker measures sizes
                on some samples only): its times count (step wall and CPU, the sample's
                total, ``samples``), its sizes, run-queue waits and type changes do not. Such
                records are all kept until the profile holds ``TIMES_ALL`` samples, then one
                in ``TIMES_EVERY`` (partial segments too, so that no kind is favoured).
            bytes_in: payload bytes of the first record's input (0 when it is ``load``, whose
                input is an index); each later step's input is the previous step's output.
            changes_type: per record, whether the output's ``type_signature`` differed from the
                input's; omitted: no type change observed.
            reshapes: per record, whether the output's ``shape_signature`` (dtype, shape)
                differed from the input's; omitted: not measured, and the steps' ``reshapes``
                read ``None`` (unknown: AutoOrder lets no such step swap with another).
            total: the sample's time in seconds; default: the sum of the records' wall times.
                Pass it with the last segment of a sample whose segments were observed apart.
            partial: the records are a segment of a sample that continues elsewhere (e.g.
                handed to the slow lane): they count for their steps, not as a sample.
        """
        if bytes_out is None:
            self._unsized += 1
            if not self._unsized % TIMES_EVERY or self.samples < TIMES_ALL:
                self._observe_times(timings, total, partial)
            return
        m, n = len(timings), len(self.step_names)
        if len(bytes_out) != m or any(f is not None and len(f) != m
                                      for f in (changes_type, reshapes)):
            raise ValueError(
                f"observe: {m} timings, {len(bytes_out)} sizes and "
                f"{'no' if changes_type is None else len(changes_type)} type flags must align"
            )
        if not partial and m == n and m and timings[0].step == 0 and timings[-1].step == n - 1:
            walls, cpus = [t.wall for t in timings], [t.cpu for t in timings]
            self._full.append((walls, cpus, [t.queued for t in timings], bytes_out, bytes_in, total))
        else:
            if any(not 0 <= t.step < n for t in timings):
                raise ValueError(f"observe: step positions outside 0..{n - 1} ({self.step_names})")
            self._other.append((timings, bytes_out, bytes_in, total, partial))
        self._pending_samples += not partial
        if changes_type is not None and any(changes_type):
            for t, c in zip(timings, changes_type, strict=True):
                if c:
                    self._steps[t.step].type_changes += 1
        if reshapes is None:
            for t in timings:
                self._steps[t.step].unflagged += 1
        elif any(reshapes):
            for t, c in zip(timings, reshapes, strict=True):
                if c:
                    self._steps[t.step].reshapes += 1
        if len(self._full) + len(self._other) + len(self._timed) >= self._batch:
            self._flush()

    def _observe_times(
        self, timings: Sequence[StepTiming], total: float | None, partial: bool
    ) -> None:
        """``observe`` of a sample (or segment) without sizes, kept: its times only."""
        n = len(self.step_names)
        if not partial and len(timings) == n and n and timings[0].step == 0 \
                and timings[-1].step == n - 1:
            self._timed.append((timings, total))
        else:
            if any(not 0 <= t.step < n for t in timings):
                raise ValueError(f"observe: step positions outside 0..{n - 1} ({self.step_names})")
            self._other.append((timings, None, 0, total, partial))
        self._pending_samples += not partial
        if len(self._full) + len(self._other) + len(self._timed) >= self._batch:
            self._flush()

    def _flush(self) -> None:
        full, self._full = self._full, []
        other, self._other = self._other, []
        timed, self._timed = self._timed, []
        self._pending_samples = 0
        if timed:
            fields = len(timed[0][0][0])  # one flat pass: np.array over records is 3x slower
            flat = chain.from_iterable(chain.from_iterable(t[0] for t in timed))
            recs = np.fromiter(flat, np.float64, len(timed) * len(self._steps) * fields)
            recs = recs.reshape(len(timed), len(self._steps), fields)
            wall, cpu = recs[:, :, 1], recs[:, :, 2]
            for i, acc in enumerate(self._steps):
                acc.add_times(wall[:, i], cpu[:, i])
            sums = wall.sum(axis=1)
            for i, (_, given) in enumerate(timed):
                if given is not None:
                    sums[i] = given
            self._total.add_many(sums)
        if full:
            wall = np.array([f[0] for f in full], dtype=np.float64)
            cpu = np.array([f[1] for f in full], dtype=np.float64)
            queued = np.array([f[2] for f in full], dtype=np.float64)
            out = np.array([f[3] for f in full], dtype=np.float64)
            first = np.array([[f[4]] for f in full], dtype=np.float64)
            inp = np.hstack([first, out[:, :-1]])
            for i, acc in enumerate(self._steps):
                acc.add_columns(wall[:, i], cpu[:, i], inp[:, i], out[:, i], queued[:, i])
            sums = wall.sum(axis=1)
            for i, f in enumerate(full):
                sums[i] = sums[i] if f[5] is None else f[5]
            self._total.add_many(sums)
        if other:
            rows: list[list[tuple[float, float, float, float, float]]] = [
                [] for _ in self.step_names]
            times: list[list[tuple[float, float]]] = [[] for _ in self.step_names]
            totals = []
            for timings, outs, bytes_in, given, partial in other:
                total = 0.0
                if outs is None:  # times alone
                    for t in timings:
                        times[t.step].append((t.wall, t.cpu))
                        total += t.wall
                else:
                    prev = float(bytes_in)
                    for t, o in zip(timings, outs, strict=True):
                        rows[t.step].append((t.wall, t.cpu, prev, o, t.queued))
                        total += t.wall
                        prev = o
                if not partial:
                    totals.append(total if given is None else given)
            for acc, r, tw in zip(self._steps, rows, times, strict=True):
                if r:
                    cols = np.asarray(r, dtype=np.float64).T
                    acc.add_columns(cols[0], cols[1], cols[2], cols[3], cols[4])
                if tw:
                    cols = np.asarray(tw, dtype=np.float64).T
                    acc.add_times(cols[0], cols[1])
            self._total.add_many(np.asarray(totals, dtype=np.float64))

    def merge(self, other: Profiler) -> None:
        """Fold another profiler of the same steps in (e.g. one kept by a remote executor)."""
        if other.step_names != self.step_names:
            raise ValueError(f"cannot merge profiles of {other.step_names} into {self.step_names}")
        self._flush()
        other._flush()
        for mine, theirs in zip(self._steps, other._steps, strict=True):
            mine.merge(theirs)
        self._total.merge(other._total)

    def step_wall_p50s(self) -> list[float]:
        """Each step's median wall seconds so far, in step order (0.0 for a step not yet
        observed): ``[s.wall_p50 for s in self.report().steps]`` without the rest of the
        report. The training process asks for it once a second (``Monitor._push_remaining``);
        the whole report (two quantile passes per step, the totals' grid) cost it about 1.2 ms
        a call, 5 steps and full reservoirs, against 0.2 ms for the medians alone (the flush
        of the observations pending aside: due either way)."""
        self._flush()
        return [acc.wall.quantile(0.5) if acc.wall.count else 0.0 for acc in self._steps]

    def report(self) -> PipelineProfile:
        """Snapshot of the statistics so far (cheap; observing may continue afterwards)."""
        self._flush()
        grid = np.linspace(0.0, 1.0, TOTAL_GRID)
        has = self._total.count > 0
        return PipelineProfile(
            steps=tuple(
                acc.stats(name) for name, acc in zip(self.step_names, self._steps, strict=True)
            ),
            samples=self._total.count,
            total_mean=self._total.mean if has else 0.0,
            total_max=self._total.max if has else 0.0,
            total_quantiles=tuple(self._total.quantiles(list(grid))) if has else (),
            executor=self.executor,
        )
