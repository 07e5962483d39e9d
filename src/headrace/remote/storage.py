"""Near-storage preprocessing (SOPHON): remote workers on the storage nodes read every sample
and run a per-sample prefix of the steps; the training side runs the rest.

``NearStorage`` is a :class:`Remote` whose workers are placed on nodes started with the custom
resource ``headrace_storage`` (one unit per storage core). Such a worker is a *fetcher*
(``WorkerHandle.fetches``): while one is running, every fresh sample goes to a fetcher, which
reads it where it is stored, runs steps ``[0, stop)`` with ``stop`` chosen per sample, and
hands the value back; local workers resume it at ``stop`` (the path of a slow-lane hand-off,
so the seeds, the error policy, exactly-once and the state dict are the scheduler's own).
``stop = 1`` sends the raw bytes ``load`` returned. A fetcher that dies has its samples re-run
(on another fetcher, or locally once none is left: local workers take fresh samples again).

``StorageSide`` is this module's controller, without Ray: it records each sample's sizes and
CPU per step during the first epoch (``profiler/sample_sizes.py``, stage 2; workers measure
every sample, not one in eight), and at the end of each epoch decides the next epoch's stops
(``planner/near_storage.py``) from that profile, the link's bandwidth (configured, else the
bytes the last epoch moved ÷ its wall time, a lower bound), the storage cores (the fetchers')
and the training side's (the local workers').
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from typing import Any

import numpy as np

from headrace.planner import near_storage as engine
from headrace.profiler.sample_sizes import SampleSizes
from headrace.remote.config import Remote
from headrace.telemetry.stats import keep_latest

log = logging.getLogger("headrace")

RESOURCE = "headrace_storage"
"""The Ray custom resource that marks a storage node (one unit per core given to headrace)."""


@dataclasses.dataclass(frozen=True)
class NearStorage(Remote):
    """Preprocess each sample near its storage, as far as it shrinks (SOPHON).

    Use it as ``Options(remote=hr.NearStorage(...))``; every :class:`Remote` attribute applies
    (``address``, ``num_cpus`` per storage worker, ``max_workers``: storage workers at most,
    default the cluster's ``headrace_storage`` units ÷ ``num_cpus``).

    Attributes:
        policy: ``"headrace"`` (SOPHON's per-sample greedy, decided after a first epoch that
            sends raw bytes and profiles), or a comparison policy: ``"no-off"`` (raw bytes),
            ``"all-off"`` (every step on the storage node), ``"resize-off"`` (the steps up to
            and including ``resize_step`` for every sample), ``"fastflow"`` (all-or-nothing,
            decided from the same profile).
        bandwidth: bytes per second from the storage nodes to the training host (``None``:
            the last epoch's bytes ÷ its wall time, a lower bound of the link).
        storage_cores: storage CPU cores preprocessing for this job (``None``: the storage
            workers' CPUs).
        gthp: samples per second the accelerator consumes (``profiler/probe.py``'s Gthp ×
            batch size; ``None``: unknown, no accelerator bound).
        resize_step: ``"resize-off"``'s last offloaded step (a step name).
    """

    policy: str = "headrace"
    bandwidth: float | None = None
    storage_cores: float | None = None
    gthp: float | None = None
    resize_step: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.policy not in engine.POLICIES:
            raise ValueError(f"NearStorage(policy={self.policy!r}): one of {engine.POLICIES}")
        if self.policy == "resize-off" and not self.resize_step:
            raise ValueError("NearStorage(policy='resize-off') needs resize_step (a step name)")
        for name in ("bandwidth", "storage_cores", "gthp"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"NearStorage({name}=...) must be > 0 (or None)")
        if not self.read_source:
            raise ValueError("NearStorage reads samples on the storage nodes: read_source=False "
                             "would ship them there from the training host")
        if self.autoplace or self.slow_lane:
            raise ValueError("NearStorage does not take autoplace or slow_lane: its workers "
                             "are the storage nodes' fetchers")

    def placed(self) -> NearStorage:
        """The same, with this job's workers asking for one storage unit per CPU."""
        res = {**(self.resources or {}), RESOURCE: self.num_cpus}
        return dataclasses.replace(self, resources=res)


@dataclasses.dataclass(frozen=True)
class EpochRecord:
    """One epoch with near-storage preprocessing: the plan it ran and what was measured.

    ``bytes``: payload bytes of the values that left the storage side (each sample's size at
    its stop, measured in that epoch); ``wall_s``: the epoch's wall time (seconds);
    ``samples``: samples whose crossing was measured; ``handed_back``: samples a fetcher
    returned part-way (read and run up to their stop on the storage side).
    """

    epoch: int
    plan: engine.Plan | None
    bytes: float
    wall_s: float
    samples: int
    handed_back: int = 0


class StorageSide:
    """The near-storage controller of one loader (see the module docstring)."""

    def __init__(self, cfg: NearStorage, samples: int, step_names: list[str],
                 compute_cores: int) -> None:
        self.cfg = cfg
        self.step_names = list(step_names)
        self.steps = len(step_names)
        self.compute_cores = max(1, compute_cores)
        self.storage_workers = 1
        self.recorder = SampleSizes(samples, self.steps)
        self.stops = np.ones(samples, np.int16)
        """Per sample: the first step the training side runs (1: raw bytes)."""
        self.plan: engine.Plan | None = None
        self.note = "first epoch: raw bytes, profiling each sample"
        self.epochs: list[EpochRecord] = []  # the latest EPOCHS_KEPT
        self.closed = 0  # epochs accounted so far
        self._seen = np.zeros(samples, np.bool_)  # samples delivered this epoch
        self._handed_back = 0
        self._epoch_stops = self.stops
        self._lock = threading.Lock()
        fixed = self._fixed_stops()
        if fixed is not None:
            self.stops = self._epoch_stops = fixed
            self.note = f"policy {cfg.policy}: fixed, no profile needed"

    def __getitem__(self, sample: int) -> int:
        """The stop of ``sample`` this epoch (``ProxyOptions.stops``)."""
        return int(self._epoch_stops[sample])

    def _fixed_stops(self) -> np.ndarray | None:
        n, cfg = len(self.stops), self.cfg
        if cfg.policy == "no-off":
            return np.ones(n, np.int16)
        if cfg.policy == "all-off":
            return np.full(n, self.steps, np.int16)
        if cfg.policy == "resize-off":
            if cfg.resize_step not in self.step_names[1:]:
                raise ValueError(f"NearStorage(resize_step={cfg.resize_step!r}) is not a step "
                                 f"of the pipeline: {self.step_names[1:]}")
            return np.full(n, self.step_names.index(cfg.resize_step) + 1, np.int16)
        return None

    # -- listeners (scheduler thread) ----------------------------------------------------------
    def on_sample(self, index: int, step_s: float | None, slow: bool, timings: Any) -> None:
        self.recorder.observe(index, timings)
        if not 0 <= index < len(self._seen):
            return
        if step_s is not None:
            self._seen[index] = True
        elif timings and timings[0].step == 0 and timings[-1].step == self[index] - 1:
            self._handed_back += 1  # a fetcher's prefix (a local hand-off starts elsewhere)

    def on_epoch_closed(self, wall_s: float) -> None:
        """Account the epoch that ended, then decide the next one's stops."""
        with self._lock:
            seen = self._seen
            sizes = self.recorder.sizes
            rows = np.flatnonzero(seen)
            moved = sizes[rows, self._epoch_stops[rows].astype(np.int64) - 1]
            measured = np.isfinite(moved)
            self.closed += 1
            rec = EpochRecord(self.closed - 1, self.plan, float(moved[measured].sum()),
                              wall_s, int(measured.sum()), self._handed_back)
            self.epochs.append(rec)
            keep_latest(self.epochs)
            self._seen = np.zeros_like(seen)
            self._handed_back = 0
            if self._fixed_stops() is None and rec.samples:
                self._decide(rec)
            self._epoch_stops = self.stops

    def _resources(self, last: EpochRecord) -> engine.Resources:
        cfg = self.cfg
        bandwidth = cfg.bandwidth
        if bandwidth is None:
            bandwidth = max(1.0, last.bytes / max(last.wall_s, 1e-6))
        cores = cfg.storage_cores or self.storage_workers * cfg.num_cpus
        gpu_s = len(self.stops) / cfg.gthp if cfg.gthp else 0.0
        return engine.Resources(bandwidth, cores, self.compute_cores, gpu_s)

    def _decide(self, last: EpochRecord) -> None:
        prof = self.recorder.profile()
        if self.recorder.measured() == 0:
            return
        res = self._resources(last)
        sizes, cpu, _ = prof.filled()
        raw = float(sizes[:, 0].mean())
        cpu_s = float(cpu[:, 1:].sum(axis=1).mean())
        ok, why = engine.io_bound(res.bandwidth / max(raw, 1.0),
                                  res.compute_cores / cpu_s if cpu_s > 0 else math.inf,
                                  self.cfg.gthp or math.inf)
        if self.cfg.policy == "headrace" and not ok:
            self.plan = engine.no_off(prof, res)
            self.note = f"stage 1: {why}; no offloading"
        else:
            self.plan = engine.decide(self.cfg.policy, prof, res)
            self.note = f"stage 1: {why}" if self.cfg.policy == "headrace" else ""
        self.stops = self.plan.stops
        log.info("headrace %s", self.plan.describe())

    # -- explain -------------------------------------------------------------------------------
    def lines(self) -> list[str]:
        """What ``explain()`` says about near-storage preprocessing."""
        cfg = self.cfg
        bw = f"{cfg.bandwidth / 1e6:.1f} MB/s configured" if cfg.bandwidth else \
            "bandwidth measured per epoch (lower bound)"
        out = [f"near storage (SOPHON): policy {cfg.policy}, {self.storage_workers} storage "
               f"worker(s), {bw}" + (f"; {self.note}" if self.note else "")]
        if self.plan is not None:
            out.append("  " + self.plan.describe())
        for r in self.epochs[-3:]:
            pred = ""
            if r.plan is not None:
                p = r.plan.predicted
                pred = f"predicted {p.bytes / 1e6:.1f} MB, {p.epoch_s:.2f} s; "
            share = "" if r.plan is None else f", {100 * r.plan.share:.0f}% offloaded"
            out.append(f"  epoch {r.epoch}: {pred}measured {r.bytes / 1e6:.1f} MB over "
                       f"{r.samples} samples, {r.wall_s:.2f} s{share}; {r.handed_back} "
                       "handed back part-way by storage workers")
        return out
