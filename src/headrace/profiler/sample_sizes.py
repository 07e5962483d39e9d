"""Stage 2 of SOPHON's profiler (§3.1): each sample's size after every step and each step's CPU
time, recorded on the fly while an epoch runs (no extra pass over the data).

Bounded memory: two ``float32`` arrays indexed by (sample, step), 8 bytes per sample and step
(a 1.2 M-image set with 5 steps: 48 MB), allocated once for the dataset's length. A value is
the latest measurement of that sample and step (random steps change sizes from epoch to epoch;
the decision follows the latest epoch). NaN: not measured yet.

The runtime calls ``observe`` from the loader's sample listeners (``runtime/monitor.py``) with
the step timings a worker sent, for a whole sample or for the part of it run before a hand-off
(a storage-side prefix), so a sample split between two workers is recorded whole.
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True, eq=False)
class SampleProfile:
    """Per-sample sizes and CPU times, as stage 2 of the profiler records them.

    ``sizes[i, j]``: bytes of sample ``i`` after step ``j`` (``j = 0``: the raw bytes ``load``
    returned). ``cpu[i, j]``: CPU seconds step ``j`` took on sample ``i``. A row with a NaN
    (a sample not measured yet) is never offloaded and counts as the mean of measured rows.
    """

    sizes: np.ndarray
    cpu: np.ndarray

    def __post_init__(self) -> None:
        if self.sizes.ndim != 2 or self.sizes.shape != self.cpu.shape or self.sizes.shape[1] < 1:
            raise ValueError("sizes and cpu must be (samples, steps) arrays of one shape")

    @property
    def steps(self) -> int:
        return int(self.sizes.shape[1])

    def filled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sizes, cpu, known): unmeasured rows replaced by the measured rows' means."""
        sizes = np.asarray(self.sizes, dtype=np.float64)
        cpu = np.asarray(self.cpu, dtype=np.float64)
        known = np.asarray(np.isfinite(sizes).all(axis=1) & np.isfinite(cpu).all(axis=1))
        if known.all():
            return sizes, cpu, known
        if not known.any():
            raise ValueError("no sample of the profile is measured at every step")
        sizes, cpu = sizes.copy(), cpu.copy()
        sizes[~known] = sizes[known].mean(axis=0)
        cpu[~known] = cpu[known].mean(axis=0)
        return sizes, cpu, known


class SampleSizes:
    """Per-sample sizes (bytes after each step) and CPU seconds per step of one dataset.

    ``samples``: the dataset's length; ``steps``: the executed pipeline's steps, ``load``
    included (step 0: the raw bytes).
    """

    def __init__(self, samples: int, steps: int) -> None:
        if samples < 0 or steps < 1:
            raise ValueError("samples must be >= 0 and steps >= 1")
        self.sizes = np.full((samples, steps), np.nan, np.float32)
        """Bytes of sample ``i`` after step ``j`` (NaN: not measured)."""
        self.cpu = np.full((samples, steps), np.nan, np.float32)
        """CPU seconds step ``j`` took on sample ``i`` (NaN: not measured)."""
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Memory the two arrays take (bytes)."""
        return int(self.sizes.nbytes + self.cpu.nbytes)

    def observe(self, index: int, timings: Sequence[Any]) -> None:
        """Record a worker's step timings for sample ``index`` (``pipeline.runner.StepTiming``:
        ``step``, ``cpu`` seconds, ``bytes_out``; ``bytes_out < 0``: the size was not
        measured on that run, and that step is left as it was)."""
        try:
            index = operator.index(index)  # a sampler key that is no index is not recorded
        except TypeError:
            return
        if not 0 <= index < len(self.sizes):
            return
        steps = self.sizes.shape[1]
        with self._lock:
            for t in timings:
                if 0 <= t.step < steps and t.bytes_out >= 0:
                    self.sizes[index, t.step] = t.bytes_out
                    self.cpu[index, t.step] = t.cpu

    def listener(self, index: int, _step_s: float | None, _slow: bool,
                 timings: Sequence[Any]) -> None:
        """``Monitor.sample_listeners``' signature."""
        self.observe(index, timings)

    def measured(self) -> int:
        """Samples measured at every step."""
        with self._lock:
            return int((np.isfinite(self.sizes).all(axis=1)
                        & np.isfinite(self.cpu).all(axis=1)).sum())

    def profile(self) -> SampleProfile:
        """A copy for the decision engine (``planner/near_storage.py``)."""
        with self._lock:
            return SampleProfile(self.sizes.astype(np.float64), self.cpu.astype(np.float64))
