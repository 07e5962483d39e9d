"""Smart offloading (FastFlow, Algorithm 1), generalised to every step boundary. Pure.

FastFlow decides *whether* to offload (a prep stall worth at least 10%), *which* operators
(three candidate pipelines) and *how much* data (the offload ratio, between Lower and Upper).
headrace's pipelines are lists of steps, so the candidates are every range ``[a, b)`` of steps
a remote worker can run: ``a = 0`` the remote worker reads the sample itself (FastFlow's p'2:
the source is reachable from the remote node), ``a = 1`` the training host reads it and ships
the loaded value (p'1, the only kind with ``read_source=False``: the remote nodes cannot
reach the source); ``b`` is any later boundary (the remote worker hands the sample back
there and local workers finish it). p'3 (remote batching) does not exist: batches are formed
by the scheduler.

Throughputs are in samples per second, work in worker-seconds per sample (a step's mean wall
time: a worker is held for it whether it computes or waits on I/O; FastFlow's cycles would call
a step that waits free), bytes per sample. The model of a candidate's remote throughput
``Rthp(a, b)`` is the smaller of the remote capacity (workers ÷ the range's worker-seconds,
scaled by how fast the remote workers really ran in the probe) and the network (bandwidth ÷
the bytes the range moves: the shipped input when ``a = 1`` plus the value handed back at
``b``). A remote worker's seconds are a step's wall time less what it waited here for a core
(``StepCost.queued_s``): that wait is this host's, not the step's.

FastFlow's Lthp is what all the local CPUs deliver; headrace's is measured with the local
workers running then, which may be fewer than the loader may run (``num_workers="auto"``
grows them). The local side's capacity is Lthp extrapolated to the workers it may run
(``local_thp``): the decision says "no" where those would remove the stall, and the
estimate of a range counts them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from headrace.profiler.report import PipelineProfile

SPEEDUP_THRESHOLD = 1.1
"""Offload only when removing the stall could speed training up by at least 10% (FastFlow)."""
LINK_BOUND_SHARE = 0.8
"""A remote probe reaching this share of the link's sample rate counts as link-bound."""
LOCAL_BUSY_SHARE = 0.5
"""Offload only when, at Lthp, the steps keep at least this share of the local workers busy
(``Lthp × Pcycle ÷ local_workers``). FastFlow's Lower and line-7 estimate assume the local CPUs
limit Lthp; when the workers idle, the stall is elsewhere (the training process, collation,
the transport) and offloading their work cannot remove it. Not 1: a saturated worker also
spends time the profile does not see between steps (receiving a task, sending the sample),
so it reads below 1; under a half it idles, whatever that time is."""


@dataclasses.dataclass(frozen=True)
class StepCost:
    """One step's mean cost per sample: ``work_s`` worker-seconds (its wall time),
    ``bytes_out`` output bytes, ``queued_s`` seconds of ``work_s`` the step waited on this host
    for a core (``StepStats.queued_mean``; more workers than cores make it)."""

    name: str
    work_s: float
    bytes_out: float
    queued_s: float = 0.0

    @property
    def remote_s(self) -> float:
        """Worker-seconds the step takes on a remote worker with its own core: ``work_s``
        less this host's run-queue wait (FastFlow's cycles count no waiting either)."""
        return max(0.0, self.work_s - max(0.0, self.queued_s))


@dataclasses.dataclass(frozen=True)
class OffloadInputs:
    """What the decision is made from (FastFlow's Table 1, per sample).

    ``gthp``: what the accelerator consumes at most (samples/s; ``profiler/probe.py``; ``inf``
    when unknown: no accelerator bound). ``lthp``: training throughput with local workers only
    (samples/s). ``steps``: per-step cost, step 0 the load. ``remote_workers``: workers
    available. ``remote_thp``: samples/s the remote workers delivered in the probe running the
    whole pipeline (``None``: not probed; the profile's CPU times are trusted as they are).
    ``bandwidth``: bytes/s between the remote workers and this host. ``overhead_s``: local CPU
    seconds an offloaded sample costs here (receiving, unpacking, copying). ``read_source``:
    the remote workers can read the source (``Remote(read_source=...)``); ``False``: this host
    reads every sample (step 0) and ships it, so only ranges from step 1 are candidates, and
    the probe behind ``remote_thp`` ran steps 1.. remotely with the loaded value shipped.
    ``local_workers``: local workers that ran the steps while Lthp was measured (``None``:
    unknown, taken as 1, the fewest a loader with remote workers has: ``LOCAL_BUSY_SHARE``).
    ``local_max``: local workers the loader may run at most that add throughput, its bounds
    and the cores both counted (``local_bound``; ``None``: ``local_workers``, none more).
    ``local_only``: Lthp was measured with no sample offloaded (the probe, or an epoch that
    offloaded none), so local workers it left idle mean a stall elsewhere; ``False``: it is
    the local CPU an offloading epoch used (``planner/replan.local_capacity``), idle while
    local workers waited on remote ones, which says nothing of where a stall is.
    """

    gthp: float
    lthp: float
    steps: Sequence[StepCost]
    remote_workers: int
    bandwidth: float
    overhead_s: float = 0.0
    remote_thp: float | None = None
    read_source: bool = True
    local_workers: int | None = None
    local_only: bool = True
    local_max: int | None = None

    def __post_init__(self) -> None:
        # FastFlow's line 3 divides by Lthp, and a NaN compares False everywhere: a NaN step
        # time read as 0 (``max(0.0, nan)``) and a NaN Lthp as a stall worth removing
        _check("Lthp", self.lthp, "samples/s (training throughput on local workers)",
               finite=True, positive=True)
        _check("Gthp", self.gthp, "samples/s (inf: no accelerator bound known)", positive=True)
        _check("bandwidth", self.bandwidth, "bytes/s (inf: no link limit)")
        _check("overhead_s", self.overhead_s, "CPU seconds per offloaded sample", finite=True)
        if self.remote_thp is not None:
            _check("remote_thp", self.remote_thp, "samples/s (None: not probed)", finite=True)
        for s in self.steps:  # a negative time (a clock going back) counts as 0
            for name, v in (("work_s", s.work_s), ("bytes_out", s.bytes_out),
                            ("queued_s", s.queued_s)):
                if not math.isfinite(v):
                    raise ValueError(f"offload: step {s.name!r} has {name} = {v!r}: a "
                                     "finite number is needed (a profile with a NaN or "
                                     "infinite mean cannot be decided from)")
        if self.remote_workers < 0:
            raise ValueError(f"offload: remote_workers = {self.remote_workers} must be >= 0")
        if self.local_workers is not None and self.local_workers < 1:
            raise ValueError(f"offload: local_workers = {self.local_workers} must be >= 1 "
                             "(None: unknown)")
        if self.local_max is not None and self.local_max < 1:
            raise ValueError(f"offload: local_max = {self.local_max} must be >= 1 "
                             "(None: no more than local_workers)")

    @property
    def first_remote(self) -> int:
        """The first step a remote worker can run: 0 when it reads the source, else 1."""
        return 0 if self.read_source else 1


def _check(name: str, v: float, unit: str, finite: bool = False, positive: bool = False
           ) -> None:
    """Raise ``ValueError`` naming metric ``name`` unless ``v`` is a number >= 0 (> 0 with
    ``positive``; not ``inf`` with ``finite``); never NaN."""
    bad = math.isnan(v) or v < 0 or (positive and v == 0) or (finite and math.isinf(v))
    if bad:
        need = "> 0" if positive else ">= 0"
        raise ValueError(f"offload: {name} = {v!r} cannot be decided from: it must be {need}"
                         f"{' and finite' if finite else ''}, in {unit}")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A range ``[start, stop)`` of steps run remotely, with the model's numbers for it."""

    start: int
    stop: int
    rthp: float  # samples/s the remote workers sustain on this range
    ocycle: float  # local CPU seconds per offloaded sample (overhead + steps outside the range)
    estimate: float  # training samples/s with this range (see ``_estimate``)


@dataclasses.dataclass(frozen=True)
class OffloadDecision:
    """Offload or not, where, how much, and the numbers that decided it."""

    offload: bool
    reason: str
    gthp: float
    lthp: float
    pcycle: float  # local CPU seconds per sample without offloading
    best: Candidate | None = None
    lower: float = 0.0  # samples/s to offload at least, else the local CPUs stay the bottleneck
    upper: float = 0.0  # samples/s to offload at most, else the remote side becomes it
    ratio: float = 0.0  # share of samples to offload (0..1)
    predicted: float = 0.0  # training samples/s predicted with this decision
    candidates: tuple[Candidate, ...] = ()
    local: float = 0.0  # samples/s the local workers may reach alone (``local_thp``; 0: not asked)

    def workers_needed(self, per_worker_thp: float, available: int) -> int:
        """Remote workers for the offloaded share: ⌈ratio·predicted ÷ one worker's rate⌉
        (FastFlow §7), at most ``available``."""
        if not self.offload or per_worker_thp <= 0:
            return 0
        return min(available, max(1, math.ceil(self.ratio * self.predicted / per_worker_thp)))

    def describe(self) -> str:
        if not self.offload:
            return f"offload: no ({self.reason})"
        b = self.best
        assert b is not None
        where = "remote workers read the source" if b.start == 0 else "this host reads the source"
        return (f"offload: yes ({self.reason}); steps [{b.start}, {b.stop}) remote ({where}); "
                f"ratio {self.ratio:.2f} (Lower {self.lower:.1f}/s, Upper {self.upper:.1f}/s); "
                f"Gthp {self.gthp:.1f}/s, Lthp {self.lthp:.1f}/s{self._more_local()}, "
                f"Rthp {b.rthp:.1f}/s, Ocycle "
                f"{1e3 * b.ocycle:.2f} ms, Pcycle {1e3 * self.pcycle:.2f} ms; predicted "
                f"{self.predicted:.1f} samples/s")

    def _more_local(self) -> str:
        return (f" ({self.local:.1f}/s with the local workers it may run)"
                if self.local > self.lthp else "")


def local_bound(bound: int, cores: float, cpu_share: float | None) -> int:
    """Local workers that may add throughput: at most ``bound`` (``num_workers``, or the worker
    scaler's upper bound with ``"auto"``), and no more than the ``cores`` keep busy,
    ⌈cores ÷ cpu_share⌉ (``cpu_share``: a sample's CPU seconds ÷ its wall seconds in a worker,
    ``profiler.report.cpu_share``; ``None``: unknown, taken as 1, CPU-bound: the cores)."""
    share = cpu_share if cpu_share is not None and cpu_share > 0 else 1.0
    return max(1, min(bound, math.ceil(cores / share)))


def local_thp(x: OffloadInputs) -> float:
    """Samples/s the local workers may reach alone: Lthp × ``local_max`` ÷ ``local_workers``,
    each worker the loader may still start adding what one of those measured delivered
    (FastFlow's Lthp is what all the local CPUs deliver: here the workers that ran it may be
    fewer than the loader may run). Lthp itself when no more may start, or either count is
    unknown."""
    if x.local_max is None or x.local_workers is None:
        return x.lthp
    return x.lthp * max(1.0, x.local_max / x.local_workers)


def probe_link_bound(x: OffloadInputs) -> bool:
    """Whether the remote probe (the whole pipeline on every remote worker, reading the source
    there, so only the finished sample crosses; with ``read_source=False`` the loaded value
    crosses too) was limited by the link rather than by the workers' CPUs: it reached at least
    ``LINK_BOUND_SHARE`` of what the link carries. Its throughput then says nothing about one
    worker's speed."""
    if x.remote_thp is None or len(x.steps) <= x.first_remote:
        return False
    moved = x.steps[-1].bytes_out + (x.steps[0].bytes_out if x.first_remote else 0.0)
    if moved <= 0 or not math.isfinite(x.bandwidth):
        return False
    return x.remote_thp >= LINK_BOUND_SHARE * x.bandwidth / moved


def remote_speed(x: OffloadInputs) -> float:
    """Remote worker-seconds per profiled second (>1: remote workers slower than this host),
    from the probe (which ran steps ``first_remote``.. remotely); 1 when it was not probed or
    was link-bound (``probe_link_bound``)."""
    pcycle = sum(s.remote_s for s in x.steps[x.first_remote:])
    if (x.remote_thp is None or x.remote_thp <= 0 or pcycle <= 0 or x.remote_workers <= 0
            or probe_link_bound(x)):
        return 1.0
    return (x.remote_workers / pcycle) / x.remote_thp


def per_worker_thp(x: OffloadInputs, start: int = 0, stop: int | None = None) -> float:
    """Samples/s one remote worker runs steps ``[start, stop)`` at, CPU only (its share of
    the link is the model's other bound): the sizing of FastFlow §7's worker count."""
    work = sum(s.remote_s for s in x.steps[start:stop]) * remote_speed(x)
    return 1.0 / work if work > 0 else math.inf


def worker_rate(x: OffloadInputs, decision: OffloadDecision) -> float | None:
    """One remote worker's samples/s on the decision's range, for its worker count: the probe's
    total over the workers when the probe was CPU-bound; the profile's CPU time when it was
    link-bound (its total over the workers would make each look slow and ask for every worker:
    seen, 12 of 12 for a 0.29 share over a 20 MB/s link); ``None``: unknown."""
    if x.remote_thp and x.remote_workers and not probe_link_bound(x):
        return x.remote_thp / x.remote_workers
    if decision.best is None:
        return None
    rate = per_worker_thp(x, decision.best.start, decision.best.stop)
    return rate if math.isfinite(rate) else None


def candidates(x: OffloadInputs) -> list[Candidate]:
    """Every range a remote worker can run, with its modelled throughput (FastFlow line 6):
    from step 0 and from step 1, or from step 1 only when it cannot read the source."""
    n = len(x.steps)
    cpu = [max(0.0, s.work_s) for s in x.steps]  # here: a local worker is held for the wait
    remote = [s.remote_s for s in x.steps]
    pcycle = sum(cpu)
    speed = remote_speed(x)
    local = local_thp(x)
    out = []
    for start in range(x.first_remote, 2):
        for stop in range(start + 1, n + 1):
            work = sum(remote[start:stop]) * speed
            moved = (x.steps[start - 1].bytes_out if start > 0 else 0.0) \
                + (x.steps[stop - 1].bytes_out if stop > 0 else 0.0)
            cpu_bound = x.remote_workers / work if work > 0 else math.inf
            net_bound = x.bandwidth / moved if moved > 0 else math.inf
            rthp = min(cpu_bound, net_bound)
            if not math.isfinite(rthp):
                continue  # a range of no work moving no bytes: nothing to offload
            ocycle = x.overhead_s + pcycle - sum(cpu[start:stop])
            out.append(Candidate(start, stop, rthp, ocycle, _estimate(local, pcycle, rthp, ocycle)))
    return out


def _estimate(local: float, pcycle: float, rthp: float, ocycle: float) -> float:
    """Training samples/s with remote workers at ``rthp`` on a range: the local workers (worth
    ``local × pcycle`` worker-seconds per second, ``local`` the samples/s they may reach
    alone: ``local_thp``, the capacity available, not only the capacity in use at Lthp) spend
    ``ocycle`` on each offloaded sample and ``pcycle`` on each local one. FastFlow writes
    ``Lthp·(1 − Ocycle/Pcycle) + Rthp`` with whole-run cycle counts and whole-pipeline
    offloading; per sample, with ranges that leave steps to the local workers, the local work
    of offloaded samples must be counted."""
    capacity = local * pcycle
    remote = min(rthp, capacity / ocycle) if ocycle > 0 else rthp
    local = max(0.0, capacity - remote * ocycle) / pcycle if pcycle > 0 else 0.0
    return remote + local


def decide(x: OffloadInputs) -> OffloadDecision:
    """FastFlow's Algorithm 1 over every step boundary, after line 3 refusing when the local
    workers do not limit Lthp (``_local_not_bottleneck``): the rule assumes they do, and when
    the local workers the loader may still start would remove the stall (``local_thp``).
    Lines 7-13 take the local side at that capacity, and offloading must beat it by
    ``SPEEDUP_THRESHOLD``."""
    pcycle = sum(max(0.0, s.work_s) for s in x.steps)
    g, lt = x.gthp, x.lthp
    if x.remote_workers <= 0:
        return OffloadDecision(False, "no remote worker available", g, lt, pcycle,
                               predicted=lt)
    if g <= lt or g / lt < SPEEDUP_THRESHOLD:
        return OffloadDecision(
            False, f"no stall worth removing: Gthp/Lthp = {g / lt:.2f} < {SPEEDUP_THRESHOLD}",
            g, lt, pcycle, predicted=min(g, lt))
    refused = _local_not_bottleneck(x, pcycle)
    if refused is not None:
        return OffloadDecision(False, refused, g, lt, pcycle, predicted=min(g, lt))
    local = local_thp(x)
    if g / local < SPEEDUP_THRESHOLD:
        return OffloadDecision(
            False, f"more local workers would remove the stall: {x.local_workers} ran at Lthp "
            f"{lt:.1f}/s, the loader may run {x.local_max}: {local:.1f}/s, Gthp/that = "
            f"{g / local:.2f} < {SPEEDUP_THRESHOLD}", g, lt, pcycle,
            predicted=min(g, local), local=local)
    cands = candidates(x)
    if not cands:
        return OffloadDecision(False, "no step has work to offload", g, lt, pcycle, predicted=lt)
    best = max(cands, key=lambda c: (c.estimate, -c.ocycle))  # line 7
    upper = best.rthp  # line 8
    share = best.ocycle / pcycle if pcycle > 0 else 1.0
    # line 9: FastFlow's (Gthp − Lthp)·(1 + O/P) is the first-order form of the exact
    # (Gthp − Lthp) ÷ (1 − O/P): what must go remote for the local CPUs to keep up
    lower = (x.gthp - local) / (1 - share) if share < 1 else math.inf
    # lines 10-13: enough remote capacity: offload what it takes; else a bottleneck either
    # way, balanced by capacity
    ratio = min(1.0, upper / x.gthp if lower < upper else best.rthp / (local + best.rthp))
    predicted = min(x.gthp, best.estimate)
    if predicted < SPEEDUP_THRESHOLD * local:
        return OffloadDecision(
            False, f"the best range [{best.start}, {best.stop}) would reach "
            f"{predicted:.1f}/s against {local:.1f}/s local: under {SPEEDUP_THRESHOLD}x",
            g, lt, pcycle, best=best, lower=lower, upper=upper, predicted=local,
            candidates=tuple(cands), local=local)
    why = (f"Gthp/Lthp = {x.gthp / x.lthp:.2f}" if math.isfinite(x.gthp)
           else "no accelerator bound known")
    return OffloadDecision(True, why, g, lt, pcycle, best=best, lower=lower, upper=upper,
                           ratio=ratio, predicted=predicted, candidates=tuple(cands),
                           local=local)


def _local_not_bottleneck(x: OffloadInputs, pcycle: float) -> str | None:
    """Why the local workers do not limit Lthp, so that offloading their work cannot raise it
    (None: they may). FastFlow's rule takes a prep stall to be a local CPU bottleneck. Not
    asked of an Lthp an offloading epoch measured (``OffloadInputs.local_only``): its local
    workers waited on the remote ones, and refusing there turned offloading off and on in
    turn at each replan (a review: half the epochs at 100 samples/s instead of 160)."""
    if not x.local_only:
        return None
    if pcycle <= 0:
        return ("the steps take no local worker time (Pcycle = 0 ms): the local workers do "
                "not limit Lthp, so offloading cannot raise it")
    # unknown: at least one (a loader with remote workers has num_workers >= 1)
    workers = 1 if x.local_workers is None else x.local_workers
    busy = x.lthp * pcycle  # local workers the steps keep busy at Lthp
    if busy >= LOCAL_BUSY_SHARE * workers:
        return None
    of = f"{workers}" if x.local_workers is not None else "at least 1"
    return (f"the local workers are not the bottleneck: at Lthp {x.lthp:.1f}/s the steps "
            f"(Pcycle {1e3 * pcycle:.3f} ms) keep {busy:.2f} of {of} busy "
            f"({busy / workers:.0%}, under {LOCAL_BUSY_SHARE:.0%}): the stall is "
            "elsewhere (the training process, collation, the transport), which offloading the "
            "steps does not remove")


def inputs_from_profile(profile: PipelineProfile, gthp: float, lthp: float,
                        remote_workers: int, bandwidth: float = math.inf,
                        overhead_s: float = 0.0, remote_thp: float | None = None,
                        read_source: bool = True, local_workers: int | None = None,
                        local_max: int | None = None) -> OffloadInputs:
    """The decision's inputs from a measured profile (per-step mean wall seconds, of them the
    mean wait for a core, and output bytes) and throughputs in samples/s (``ProbeResult``'s
    batches/s × batch size)."""
    steps = tuple(StepCost(s.name, s.wall_mean, max(0.0, s.bytes_out_mean), s.queued_mean)
                  for s in profile.steps)
    return OffloadInputs(gthp=gthp, lthp=lthp, steps=steps, remote_workers=remote_workers,
                         bandwidth=bandwidth, overhead_s=overhead_s, remote_thp=remote_thp,
                         read_source=read_source, local_workers=local_workers,
                         local_max=local_max)
