"""When to make FastFlow's offloading decision again, and from what. Pure.

FastFlow decides once, before training, from a profile. A decision goes stale when what it was
made from changes: the cluster (a node joins or leaves: the remote workers available), the
pipeline's cost (a later phase of the data, another augmentation policy: the profile's
per-sample work), or the model itself was wrong (the throughput measured epoch after epoch is
far from the one predicted). :func:`check_cluster` and :func:`check_epoch` say when; the runtime
(``remote/replan.py``) calls them on scheduler ticks and at epoch boundaries. :func:`revise`
turns the inputs of the decision in force into those of the next one, keeping what was
measured and changing what was observed; ``planner.offload.decide`` then decides as at first.

Throughputs in samples per second, work in worker-seconds per sample, as in ``offload.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from headrace.planner.offload import OffloadDecision, OffloadInputs, StepCost


@dataclasses.dataclass(frozen=True)
class ReplanConfig:
    """When a change counts.

    ``drift``: relative gap between an epoch's measured samples/s and the decision's prediction
    (``|measured / predicted - 1|``) that counts as the model being wrong. ``patience``:
    consecutive such epochs before deciding again (one slow epoch may be start-up or another
    job on the machine). ``profile_drift``: relative change of the per-sample work (Pcycle)
    that counts as the pipeline having changed.
    """

    drift: float = 0.25
    patience: int = 2
    profile_drift: float = 0.25

    def __post_init__(self) -> None:
        if self.drift <= 0 or self.profile_drift <= 0 or self.patience < 1:
            raise ValueError("ReplanConfig: drift and profile_drift must be > 0, patience >= 1")


@dataclasses.dataclass(frozen=True)
class EpochObservation:
    """One finished epoch as the runtime saw it.

    ``samples`` delivered in ``wall_s`` seconds, ``remote_samples`` of them finished by remote
    workers; ``steps``: the profile's per-step cost now (empty: not profiled).
    """

    samples: int
    wall_s: float
    remote_samples: int
    steps: Sequence[StepCost] = ()

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Watch:
    """The decision in force, what it was made from, and the drifting epochs seen since."""

    inputs: OffloadInputs
    decision: OffloadDecision
    drifting: int = 0


def pcycle(steps: Sequence[StepCost]) -> float:
    """Worker-seconds one sample costs on the whole pipeline."""
    return sum(max(0.0, s.work_s) for s in steps)


def check_cluster(watch: Watch, remote_workers: int) -> str | None:
    """Why to decide again now that ``remote_workers`` remote workers are available (None:
    the same number the decision was made with)."""
    before = watch.inputs.remote_workers
    if remote_workers == before:
        return None
    verb = "joined" if remote_workers > before else "left"
    return f"cluster changed (capacity {verb}): {before} -> {remote_workers} remote workers"


def check_epoch(cfg: ReplanConfig, watch: Watch, obs: EpochObservation
                ) -> tuple[Watch, str | None]:
    """Fold one finished epoch in: (the watch updated, why to decide again or None)."""
    if obs.steps and watch.inputs.steps:
        before, now = pcycle(watch.inputs.steps), pcycle(obs.steps)
        if before > 0 and abs(now / before - 1) > cfg.profile_drift:
            return dataclasses.replace(watch, drifting=0), (
                f"profile changed: {1e3 * before:.1f} -> {1e3 * now:.1f} ms of work per sample")
    predicted = watch.decision.predicted
    measured = obs.samples_per_s
    if predicted <= 0 or measured <= 0 or abs(measured / predicted - 1) <= cfg.drift:
        return dataclasses.replace(watch, drifting=0), None
    drifting = watch.drifting + 1
    if drifting < cfg.patience:
        return dataclasses.replace(watch, drifting=drifting), None
    return dataclasses.replace(watch, drifting=0), (
        f"throughput drifted: measured {measured:.1f}/s against {predicted:.1f}/s predicted "
        f"for {drifting} epoch(s)")


def local_capacity(watch: Watch, obs: EpochObservation) -> float | None:
    """The local workers' capacity measured in ``obs``, as whole-pipeline samples/s (what Lthp
    means), or None when the epoch says nothing about it: the accelerator was the bound (the
    local workers idled), no time passed, or no local CPU was spent (every sample remote at
    no cost here: Lthp 0, which a decision cannot be made from). Local CPU-seconds spent =
    local samples × Pcycle + remote samples × Ocycle (each sample finished remotely still
    costs its ``ocycle`` here)."""
    x, d = watch.inputs, watch.decision
    p = pcycle(obs.steps or x.steps)
    if obs.wall_s <= 0 or p <= 0 or obs.samples_per_s >= x.gthp / (1 + 0.1):
        return None
    ocycle = d.best.ocycle if d.offload and d.best is not None else p
    local = max(0, obs.samples - obs.remote_samples)
    lthp = (local * p + obs.remote_samples * ocycle) / obs.wall_s / p
    return lthp if lthp > 0 else None


def revise(x: OffloadInputs, remote_workers: int | None = None,
           steps: Sequence[StepCost] | None = None, lthp: float | None = None,
           offloaded: bool = False) -> OffloadInputs:
    """The next decision's inputs: ``x`` with what changed. The local CPUs keep their capacity
    in CPU-seconds (Lthp scales with 1/Pcycle when the steps change, unless a measured ``lthp``
    is given); a remote worker keeps its measured speed (Rthp scales with the worker count and
    with 1/Pcycle). Gthp, the link and the overhead per sample stay as measured.
    ``offloaded``: the epoch ``lthp`` was measured in offloaded samples (``local_capacity``
    then counts the local CPU used, not what the local workers could do alone:
    ``OffloadInputs.local_only``)."""
    before = pcycle(x.steps)
    new_steps = tuple(steps) if steps else tuple(x.steps)
    now = pcycle(new_steps)
    scale = before / now if before > 0 and now > 0 else 1.0
    workers = x.remote_workers if remote_workers is None else remote_workers
    rthp = x.remote_thp
    if rthp is not None:
        rthp = rthp * scale * (workers / x.remote_workers) if x.remote_workers > 0 else None
    return dataclasses.replace(
        x, steps=new_steps, remote_workers=workers, remote_thp=rthp,
        lthp=lthp if lthp is not None else x.lthp * scale,
        local_only=x.local_only if lthp is None else not offloaded)
