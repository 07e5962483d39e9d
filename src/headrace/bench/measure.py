"""One measured epoch of one loader on one workload, with a simulated accelerator.

The consumer loop takes a batch, checks its indices, and sleeps ``accelerator_step_s`` (the
accelerator step). Every loader gets a fresh instance and a first epoch, on one fixed sampler
order (``sampler=list(order)``), so the ideal pipeline is simulated on exactly the order each
loader used, with the per-sample costs measured in that very run:

* headrace rows: ``loader.add_sample_listener`` reports each sample's load + step time;
* the minimal reference loader (``bench/minimal.py``) reports them as headrace does;
* torch rows: :class:`CostTaggedDataset` runs the pipeline's steps inside the worker, sums their
  wall times as headrace does, and adds the sum to the sample as ``"cost_s"``, read back from
  the batches.

Times are seconds from just before ``iter(loader)``; ``wall_s`` ends when the last accelerator
step ends (what the ideal's ``end_s`` measures), so worker shutdown is not counted.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch.utils.data as tud

from headrace.bench.config import LoaderSpec
from headrace.bench.resources import ResourceMonitor, ResourceUse
from headrace.bench.yardsticks import num_batches, simulate_ideal, work_conserving_bound
from headrace.pipeline import Pipeline
from headrace.pipeline.runner import SampleRunner
from headrace.workloads import Workload

COST_KEY = "cost_s"
"""Entry :class:`CostTaggedDataset` adds to each sample: its preprocessing time in seconds."""


class ExactlyOnceError(AssertionError):
    """A loader delivered some index of the epoch zero or several times."""


class CostTaggedDataset(tud.Dataset):
    """``pipeline[i]`` plus its preprocessing time in seconds under :data:`COST_KEY`.

    The time is measured exactly as headrace reports it to sample listeners: the sum of the
    wall times of ``load`` and every step, without the per-step seeding between them, so both
    loaders' ideals are computed from the same quantity. Samples must be dicts.
    """

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self._runner: SampleRunner | None = None  # built lazily in each worker

    def __len__(self) -> int:
        return len(self.pipeline)

    def __getstate__(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "_runner": None}

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._runner is None:
            self._runner = SampleRunner(self.pipeline)
        out = self._runner.run(index, 0, None, base_seed=0, epoch=0)
        if out.error is not None:
            raise out.error[1]
        if not isinstance(out.value, dict):
            raise TypeError(f"benchmark samples must be dicts, got {type(out.value).__name__}")
        return {**out.value, COST_KEY: math.fsum(t.wall for t in out.timings)}


@dataclasses.dataclass
class HeadraceTrace:
    """What ``loader.stats()`` said after the epoch; times in seconds from the epoch start.

    Attributes:
        fast_samples / slow_samples: samples finished in the fast lane / via the slow lane.
        timeout_s / timeout_percentile: the learned hand-off timeout at the end, and its basis.
        main_cpu_per_batch_ms: headrace's own report of training-process CPU per batch (ms).
        stall_s: headrace's own count of time ``next()`` waited (s).
        workers: (t, workers) at every change.
        timeout: (t, timeout seconds) at every change (``inf`` during warm-up).
        queues: (t, ready_batches, ready_samples, in_flight, slow_backlog) samples.
        cache: what the sample cache did in the epoch (``None``: no cache).
        workers_max: the most workers the loader has had so far (``num_workers="auto"``
            varies it).
    """

    fast_samples: int
    slow_samples: int
    timeout_s: float
    timeout_percentile: float
    main_cpu_per_batch_ms: float
    stall_s: float
    workers: list[tuple[float, int]]
    timeout: list[tuple[float, float]]
    queues: list[tuple[float, int, int, int, int]]
    cache: Any = None
    workers_max: int = 0


@dataclasses.dataclass
class RunRecord:
    """One measured epoch. Times in seconds, memory in bytes.

    Attributes:
        label / spec: the loader row this run belongs to.
        wall_s: from ``iter(loader)`` to the end of the last accelerator step.
        ideal_s: the ideal pipeline's end time on this order and these costs.
        bound_s: the work-conserving bound for these costs.
        ideal_stall_fraction: the ideal pipeline's stall fraction (the floor for ``stall``).
        stall_s: time the consumer waited inside ``next()`` for a batch.
        samples / batches: delivered (checked exactly once).
        resources: peak RSS and CPU-seconds.
        batch_times: per batch (time it arrived, seconds waited for it, samples).
        costs: per-sample preprocessing time in seconds, in sampler order.
        consumer_step_s: consumer time per batch the yardsticks used (the simulated
            accelerator step, or the mean measured ``consume`` time).
        ideal_batch_start_s: when the ideal pipeline's consumer started each batch.
        consumer_busy_s: time the consumer spent in its steps (sleeping, or ``consume``):
            above ``consumer_step_s × batches`` when sleeps overran on a busy machine.
        headrace: the loader's own stats (headrace rows only).
    """

    label: str
    spec: LoaderSpec
    wall_s: float
    ideal_s: float
    bound_s: float
    ideal_stall_fraction: float
    stall_s: float
    samples: int
    batches: int
    resources: ResourceUse
    batch_times: list[tuple[float, float, int]]
    costs: list[float]
    consumer_step_s: float
    ideal_batch_start_s: tuple[float, ...] = ()
    consumer_busy_s: float = 0.0
    headrace: HeadraceTrace | None = None

    @property
    def vs_ideal(self) -> float:
        """wall ÷ ideal (1.00: no overhead beyond fill and drain)."""
        return self.wall_s / self.ideal_s if self.ideal_s > 0 else math.inf

    @property
    def vs_bound(self) -> float:
        """wall ÷ work-conserving bound (>= 1)."""
        return self.wall_s / self.bound_s if self.bound_s > 0 else math.inf

    @property
    def stall_fraction(self) -> float:
        """Share of the wall time the consumer waited for data."""
        return self.stall_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def main_cpu_per_batch_ms(self) -> float:
        """Training-process CPU per batch (ms), measured the same way for every loader."""
        return 1000.0 * self.resources.main_cpu_s / self.batches if self.batches else 0.0


def make_loader(
    workload: Workload, spec: LoaderSpec, order: Sequence[int], options: Any = None
) -> Any:
    """A fresh loader for ``spec`` over ``workload`` with the fixed sampler ``order``.

    ``options``: a :class:`headrace.Options` for headrace rows (``None``: the defaults).
    """
    common: dict[str, Any] = {
        "batch_size": workload.batch_size,
        "sampler": list(order),
        "num_workers": spec.num_workers,
        "prefetch_factor": spec.prefetch_factor if spec.num_workers > 0 else None,
        "in_order": spec.in_order,
    }
    if spec.persistent_workers and spec.num_workers > 0:
        common["persistent_workers"] = True
    if spec.kind == "headrace":
        from headrace.runtime import DataLoader, Options

        if spec.executor != "processes":
            options = dataclasses.replace(options or Options(), executor=spec.executor)
        if spec.auto_workers:
            common["num_workers"] = "auto"
        return DataLoader(workload.pipeline, options=options, **common)
    if spec.kind == "minimal":
        from headrace.bench.minimal import MinimalLoader

        return MinimalLoader(workload.pipeline, order, workload.batch_size, spec.num_workers,
                             spec.prefetch_factor)
    return tud.DataLoader(CostTaggedDataset(workload.pipeline), **common)


def run_once(
    workload: Workload,
    spec: LoaderSpec,
    order: Sequence[int],
    resource_interval_s: float = 0.1,
    consume: Callable[[Any], None] | None = None,
    options: Any = None,
) -> RunRecord:
    """Run one epoch of ``spec`` on ``workload`` and measure it (see the module docstring).

    ``options``: :class:`headrace.Options` for headrace rows. ``consume(batch)`` replaces the
    simulated accelerator (``headrace demo`` trains a model in it); the ideal then uses the
    mean measured ``consume`` time as the consumer step.

    Raises:
        ExactlyOnceError: an index of ``order`` was delivered zero or several times, or a
            sample's cost is missing.
    """
    return run_epochs(workload, spec, order, 1, resource_interval_s, consume, options)[0]


def run_epochs(
    workload: Workload,
    spec: LoaderSpec,
    order: Sequence[int],
    epochs: int,
    resource_interval_s: float = 0.1,
    consume: Callable[[Any], None] | None = None,
    options: Any = None,
) -> list[RunRecord]:
    """Run ``epochs`` epochs of ONE loader instance (each on ``order``) and measure each.

    What a training job does: later epochs keep what the loader kept (headrace's sample cache
    and profile; torch's workers with ``persistent_workers=True``). One :class:`RunRecord` per
    epoch, each checked exactly once and measured from its own ``iter(loader)``.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        loader = make_loader(workload, spec, order, options)
        created = time.perf_counter()
        costs: list[dict[int, float]] = [{}]  # the current epoch's, filled by the listener
        if spec.kind != "torch":
            loader.add_sample_listener(lambda i, s, _slow: costs[-1].__setitem__(i, s))
        records = []
        try:
            for _ in range(epochs):
                records.append(_measure_epoch(loader, workload, spec, order, created,
                                              resource_interval_s, consume, costs[-1]))
                costs.append({})
            return records
        finally:
            if spec.kind == "headrace":
                loader.close()


def _measure_epoch(
    loader: Any,
    workload: Workload,
    spec: LoaderSpec,
    order: Sequence[int],
    created: float,
    resource_interval_s: float,
    consume: Callable[[Any], None] | None,
    costs: dict[int, float],
) -> RunRecord:
    """One epoch of ``loader`` from ``iter(loader)`` to its end (see :func:`run_once`).

    ``costs``: filled with each sample's preprocessing seconds during the epoch (by the
    loader's sample listener; from the batches for torch rows)."""
    seen: Counter[int] = Counter()
    batch_times: list[tuple[float, float, int]] = []
    stall = busy = 0.0
    step_s = workload.accelerator_step_s
    monitor = ResourceMonitor(resource_interval_s)
    monitor.start()
    t0 = time.perf_counter()
    it = iter(loader)
    end = t0
    try:
        while True:
            a = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            b = time.perf_counter()
            stall += b - a
            indices = batch["index"].tolist()
            seen.update(indices)
            if spec.kind == "torch":
                costs.update(zip(indices, batch[COST_KEY].tolist(), strict=True))
            batch_times.append((b - t0, b - a, len(indices)))
            if consume is None:
                time.sleep(step_s)
            else:
                consume(batch)
            end = time.perf_counter()
            busy += end - b
    finally:
        del it
        use = monitor.stop()
    trace = _headrace_trace(loader, t0, created) if spec.kind == "headrace" else None
    _check_exactly_once(seen, order, spec.label, workload.name)
    missing = [i for i in order if i not in costs]
    if missing:
        raise ExactlyOnceError(
            f"{spec.label} on {workload.name}: no cost measured for {len(missing)} sample(s), "
            f"e.g. {missing[:5]}"
        )
    cost_list = [costs[i] for i in order]
    if consume is not None and batch_times:
        step_s = busy / len(batch_times)  # the measured mean consumer step
    n_batch = num_batches(len(order), workload.batch_size)
    if spec.num_workers > 0:
        ideal = simulate_ideal(order, costs, workload.batch_size, spec.num_workers, step_s)
        ideal_s, ideal_stall, starts = ideal.end_s, ideal.stall_fraction, ideal.batch_start_s
        bound = work_conserving_bound(cost_list, spec.num_workers, step_s, n_batch)
    else:  # loading in the training process: nothing overlaps, both yardsticks are the sum
        ideal_s = bound = math.fsum(cost_list) + step_s * n_batch
        ideal_stall = math.fsum(cost_list) / ideal_s if ideal_s > 0 else 0.0
        starts = ()
    return RunRecord(
        label=spec.label,
        spec=spec,
        wall_s=end - t0,
        ideal_s=ideal_s,
        bound_s=bound,
        ideal_stall_fraction=ideal_stall,
        stall_s=stall,
        samples=sum(seen.values()),
        batches=len(batch_times),
        resources=use,
        batch_times=batch_times,
        costs=cost_list,
        consumer_step_s=step_s,
        ideal_batch_start_s=starts,
        consumer_busy_s=busy,
        headrace=trace,
    )


def _check_exactly_once(seen: Counter[int], order: Sequence[int], label: str, name: str) -> None:
    expected = Counter(order)
    if seen == expected:
        return
    missing = sorted((expected - seen).elements())
    extra = sorted((seen - expected).elements())
    raise ExactlyOnceError(
        f"{label} on {name} broke exactly-once: {len(missing)} index(es) never delivered "
        f"(e.g. {missing[:5]}), {len(extra)} delivered too often or unknown (e.g. {extra[:5]}); "
        f"{sum(seen.values())} samples delivered for an epoch of {len(order)}"
    )


def _headrace_trace(loader: Any, t0: float, created: float) -> HeadraceTrace:
    """Read ``loader.stats()`` and shift its timelines to seconds from the epoch start."""
    st = loader.stats()
    last = st.last
    # timelines count from the loader's creation (its monitor's clock)
    origin = getattr(getattr(loader, "monitor", None), "t0", created)
    shift = t0 - origin
    return HeadraceTrace(
        fast_samples=last.fast_samples if last else 0,
        slow_samples=last.slow_samples if last else 0,
        timeout_s=st.timeout_s,
        timeout_percentile=st.timeout_percentile,
        main_cpu_per_batch_ms=last.main_cpu_per_batch_ms if last else 0.0,
        stall_s=last.stall_s if last else 0.0,
        workers=[(t - shift, n) for t, n in st.workers_timeline],
        timeout=[(t - shift, v) for t, v in st.timeout_timeline],
        queues=[
            (q.t - shift, q.ready_batches, q.ready_samples, q.in_flight, q.slow_backlog)
            for q in st.queues
        ],
        cache=last.cache if last else None,
        workers_max=max((n for _t, n in st.workers_timeline), default=0),
    )
