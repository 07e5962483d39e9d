"""The profile report: per-step statistics of a pipeline, frozen and JSON round-trippable.

Produced by ``stats.Profiler.report()``, read by the planner, kept by the profile store.
Units: seconds per sample for times, bytes per sample for sizes (``sizes.payload_bytes``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PROFILE_SCHEMA", "TOTAL_GRID", "PipelineProfile", "StepStats"]

PROFILE_SCHEMA = 2
"""Version of :meth:`PipelineProfile.to_dict`'s layout; bump it when a field changes meaning
or goes away (2: ``StepStats.type_changes`` counts dtype changes too, so a stored profile of 1
would let a step cross a cast; it is read as a miss and replaced). A field added with a default (``StepStats.queued_mean``, ``sized``, ``reshapes``,
``PipelineProfile.executor``, ``consumer_rate`` and ``rejected_orders``) keeps it: profiles stored before read the
default, and an older headrace treats a newer profile as a miss."""

TOTAL_GRID = 101
"""Number of per-sample time quantiles kept in a report: q = 0, 0.01, ..., 1."""


@dataclasses.dataclass(frozen=True)
class StepStats:
    """What one step costs and how it changes the data, over the samples that ran it.

    Times are seconds per sample, sizes bytes per sample (``sizes.payload_bytes``).

    Attributes:
        name: step name (``"load"`` for ``Source.load``).
        count: samples whose time was measured (every sample that ran the step).
        wall_mean, wall_p50, wall_p90: wall-clock time of the step.
        cpu_mean: CPU time of the step (thread time; below wall when the step waits on I/O).
        queued_mean: time of the step's wall spent runnable but waiting for a core
            (``profiler/runqueue.py``; 0 where not measured, e.g. profiles stored before it
            was; over the ``sized`` samples only). ``cpu_mean / (wall_mean - queued_mean)`` is
            the step's CPU share whatever the load it was measured under.
        bytes_in_mean, bytes_out_mean: payload of the step's input and output (``load``'s
            input is an index: 0), over the ``sized`` samples.
        inflation: ``bytes_out_mean / bytes_in_mean``, Pecan's inflation factor (< 1:
            deflationary, > 1: inflationary); ``None`` without input bytes.
        inflation_mean, inflation_std, inflation_p10, inflation_p90: the per-sample ratio
            ``bytes_out / bytes_in`` across samples: its spread says whether ``inflation`` is a
            property of the step (narrow) or of the data (wide, e.g. a fixed-size resize of
            images of varying size).
        type_changes: samples whose output type, rank or dtype differed from the input's (any
            such sample makes the step a barrier for AutoOrder), among the ``sized`` samples.
        sized: samples whose output size, type and run-queue wait were measured, a subset of
            ``count`` (a worker measures them on its first 64 samples, then one in 8:
            ``runtime/worker.py``; every sample in the training process). ``None``: a profile
            stored before it was kept, whose ``count`` samples were all sized.
        reshapes: samples whose output's dtype or shape (``sizes.shape_signature``) differed
            from the input's, among the ``sized`` samples; ``None``: not recorded (profiles
            stored before headrace recorded it). AutoOrder swaps two steps only when one of
            them reads 0 (``keeps_shape``).
    """

    name: str
    count: int
    wall_mean: float
    wall_p50: float
    wall_p90: float
    cpu_mean: float
    bytes_in_mean: float
    bytes_out_mean: float
    inflation: float | None
    inflation_mean: float | None
    inflation_std: float | None
    inflation_p10: float | None
    inflation_p90: float | None
    type_changes: int = 0
    queued_mean: float = 0.0
    sized: int | None = None
    reshapes: int | None = None

    @property
    def changes_type(self) -> bool:
        """True when some sample's output type, rank or dtype differed from its input's."""
        return self.type_changes > 0

    @property
    def keeps_shape(self) -> bool:
        """True when the step kept its input's dtype and shape on every sample measured (False
        when it did not, measured none, or it was not recorded)."""
        measured = self.sized if self.sized is not None else self.count  # not time-only ones
        return measured > 0 and self.reshapes == 0


MIN_SHARE_WALL_S = 200e-6
"""Seconds of steps (wall less waits for a core) a sample needs for :func:`cpu_share`: the
profiler's own clock reads lie inside the wall it measures, a few µs a step, so a sample of
microseconds reads as mostly waiting (a dataset returning its index measured 0.04-0.23, and
``num_workers="auto"`` started 9-32 worker processes on 2 cores from that profile); under
this floor the share is unknown. At 200 µs those reads are a few percent of the wall."""


def cpu_share(steps: Sequence[StepStats]) -> float | None:
    """CPU ÷ wall time of a sample's ``steps``, the wall less the time they waited for a core
    (``queued_mean``), at most 1: the share of a core a sample's thread keeps busy while it
    runs, whatever the load it was measured under. ``cpu_mean`` is the worker thread's own CPU
    time, so only measurement error (clock reads a few µs apart) can put the ratio above 1.
    ``None`` when no wall time was measured, or less than ``MIN_SHARE_WALL_S``."""
    wall = sum(s.wall_mean - min(s.queued_mean, s.wall_mean) for s in steps)
    if wall < MIN_SHARE_WALL_S:
        return None
    return min(1.0, sum(s.cpu_mean for s in steps) / wall)


@dataclasses.dataclass(frozen=True)
class PipelineProfile:
    """Per-step statistics and the per-sample time distribution of one pipeline.

    Attributes:
        steps: one entry per executed step, in execution order (``load`` first).
        samples: samples observed (their step times; sizes on ``sized_samples`` of them).
        total_mean, total_max: per-sample time, the sum of its steps' wall times (seconds;
            queueing and transfer excluded).
        total_quantiles: per-sample time at q = 0, 0.01, ..., 1 (``TOTAL_GRID`` values,
            seconds); empty when no sample was observed.
        schema_version: layout version of ``to_dict`` (``PROFILE_SCHEMA``).
        executor: what ran the measured samples, ``"processes"`` or ``"threads"`` (``None``:
            not recorded; profiles stored before it was). A step's wall time in a worker
            thread includes its waits for the GIL, which a process does not have: the same
            steps read a lower CPU share under threads, so a profile sizes only a pool of
            the executor that measured it (``runtime/monitor.py``).
        consumer_rate: samples per second the training loop took while it did not wait for
            data, in the last epoch that ran to its end for at least half a second of loop time
            (``None``: none did). The next run of the job starts ``num_workers="auto"`` at no
            more workers than that rate needs.
        rejected_orders: step orders (names, ``load`` excluded) AutoOrder decided for this job
            that did not hold when a run validated them (``planner/order.py``): a later run
            keeps the declared order instead of running one epoch of them again.
    """

    steps: tuple[StepStats, ...]
    samples: int
    total_mean: float
    total_max: float
    total_quantiles: tuple[float, ...]
    schema_version: int = PROFILE_SCHEMA
    executor: str | None = None
    consumer_rate: float | None = None
    rejected_orders: tuple[tuple[str, ...], ...] = ()

    @property
    def sized_samples(self) -> int:
        """Samples the sizes (inflation factors, bytes) come from: the fewest any step that ran
        had its sizes measured on (a step's ``count`` for a profile stored before they were
        counted, which sized every sample it observed)."""
        counts = [s.sized if s.sized is not None else s.count for s in self.steps if s.count]
        return min(counts) if counts else 0

    @property
    def step_names(self) -> list[str]:
        return [s.name for s in self.steps]

    def step(self, name: str, occurrence: int = 0) -> StepStats:
        """Statistics of the step called ``name`` (its ``occurrence``-th one when repeated)."""
        seen = 0
        for s in self.steps:
            if s.name == name:
                if seen == occurrence:
                    return s
                seen += 1
        raise KeyError(f"no step {name!r} (occurrence {occurrence}) in profile {self.step_names}")

    def total_quantile(self, q: float) -> float:
        """Per-sample time (seconds) at quantile ``q``, interpolated on the kept grid."""
        if not self.total_quantiles:
            return math.nan
        grid = np.linspace(0.0, 1.0, len(self.total_quantiles))
        return float(np.interp(q, grid, self.total_quantiles))

    @property
    def total_p50(self) -> float:
        return self.total_quantile(0.5)

    @property
    def total_p90(self) -> float:
        return self.total_quantile(0.9)

    @property
    def total_p99(self) -> float:
        return self.total_quantile(0.99)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible dict (lists, numbers, strings, None); see :meth:`from_dict`."""
        d = dataclasses.asdict(self)
        d["steps"] = list(d["steps"])
        d["total_quantiles"] = list(self.total_quantiles)
        d["rejected_orders"] = [list(o) for o in self.rejected_orders]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineProfile:
        """Rebuild a profile; ``ValueError`` when written by another schema version or malformed
        (also where ``d`` is not a dict at all: a stored ``null`` or ``[]``)."""
        if not isinstance(d, dict):
            raise ValueError(f"malformed profile: a {type(d).__name__}, not a dict")
        version = d.get("schema_version")
        if version != PROFILE_SCHEMA:
            raise ValueError(f"profile schema {version!r}, this headrace reads {PROFILE_SCHEMA}")
        try:
            return cls(
                steps=tuple(StepStats(**s) for s in d["steps"]),
                samples=int(d["samples"]),
                total_mean=float(d["total_mean"]),
                total_max=float(d["total_max"]),
                total_quantiles=tuple(float(v) for v in d["total_quantiles"]),
                schema_version=PROFILE_SCHEMA,
                executor=d.get("executor"),
                consumer_rate=(None if d.get("consumer_rate") is None
                               else float(d["consumer_rate"])),
                rejected_orders=tuple(tuple(str(n) for n in o)
                                      for o in d.get("rejected_orders", ())),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed profile dict: {e}") from e
