"""FastFlow's offloading decided again while the job runs (the policy: ``planner/replan.py``).

``plan_offload`` arms an :class:`OffloadWatcher` on the loader's remote session with what its
decision was made from. The scheduler thread ticks it (``RemoteSession.on_tick_scheduler``):

- every ``CLUSTER_POLL_S`` seconds it asks Ray how many remote workers the cluster can hold now
  (``ray_backend.capacity``, one GCS call on the scheduler thread): a node that joined or left
  changes the decision at once (the link is not probed again: ``plan_offload`` measured it);
- when an epoch has ended it folds that epoch in (samples/s, the share finished remotely, the
  profile's per-step cost now): a changed profile, or a throughput far from the prediction for
  ``ReplanConfig.patience`` epochs, changes it too.

A new decision is applied where the old one was (``RemoteSession.apply_offload``: split, ratio,
remote worker target) and the running pool follows the target at once (remote workers added
or retired), so the epoch in progress benefits. Every re-decision is kept for ``explain()``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from headrace.planner.offload import (
    OffloadDecision,
    OffloadInputs,
    StepCost,
    decide,
    inputs_from_profile,
    worker_rate,
)
from headrace.planner.replan import (
    EpochObservation,
    ReplanConfig,
    Watch,
    check_cluster,
    check_epoch,
    local_capacity,
    revise,
)

log = logging.getLogger("headrace")

CLUSTER_POLL_S = 2.0
"""Seconds between two looks at the cluster's capacity (one call to Ray's GCS each)."""
HISTORY_MAX = 64
"""Re-decisions kept for ``explain()`` (oldest dropped)."""


@dataclasses.dataclass(frozen=True)
class Replan:
    """One re-decision: ``t`` seconds after the watcher started, why, the new decision, and
    the remote workers it asked for."""

    t: float
    reason: str
    decision: OffloadDecision
    remote_workers: int


def remeasured(x: OffloadInputs, steps: Sequence[StepCost] | None, lthp: float | None,
               offloaded: bool, workers: int | None) -> OffloadInputs:
    """The inputs after an epoch (``planner.replan.revise``), with ``workers`` local workers
    (the count running at its end, ``None``: unchanged) as those Lthp was measured with when
    ``lthp`` was measured: with ``num_workers="auto"`` the scaler may have grown them since
    the probe, and ``local_thp`` extrapolating the new Lthp from the probe's count counted the
    added workers twice."""
    revised = revise(x, steps=steps, lthp=lthp, offloaded=offloaded)
    if lthp is None or workers is None or workers < 1:
        return revised
    return dataclasses.replace(revised, local_workers=workers)


class OffloadWatcher:
    """Watches one loader's offloading decision and makes it again when it goes stale.

    ``profile_fn()``: the loader's profile now (or None); ``epochs_fn()``: its finished
    epochs' stats (``Monitor.epochs``). ``autoscaled``: ``num_workers="auto"``, the local
    worker count changes, so an Lthp measured again is taken with the pool's local workers
    then (``WorkerPool.own_workers``); else ``OffloadInputs.local_workers`` stays.
    """

    def __init__(self, session: Any, inputs: OffloadInputs, decision: OffloadDecision,
                 profile_fn: Callable[[], Any], epochs_fn: Callable[[], Sequence[Any]],
                 cfg: ReplanConfig | None = None, autoscaled: bool = False) -> None:
        self.session = session
        self.autoscaled = autoscaled
        self.cfg = cfg or ReplanConfig()
        self.watch = Watch(inputs, decision)
        self.history: list[Replan] = []
        self.profile_fn, self.epochs_fn = profile_fn, epochs_fn
        self.t0 = time.monotonic()
        self._polled = self.t0
        before = epochs_fn()
        self._last = before[-1] if before else None  # the last epoch folded in
        self._remote_mark = session.remote_samples

    def on_tick(self, sched: Any) -> None:
        """Scheduler thread, every pass: poll the cluster now and then, fold ended epochs in."""
        now = time.monotonic()
        if now - self._polled >= CLUSTER_POLL_S:
            self._polled = now
            try:
                workers = self.session.capacity()
            except Exception as e:  # noqa: BLE001 - Ray's GCS unreachable for a moment
                log.warning("headrace: could not read the Ray cluster's capacity: %s", e)
                workers = self.watch.inputs.remote_workers
            why = check_cluster(self.watch, workers)
            if why is not None:
                self._replan(sched.pool, why, revise(self.watch.inputs, remote_workers=workers))
        epochs = self.epochs_fn()
        if epochs and epochs[-1] is not self._last:  # the history is trimmed: not its length
            last = self._last = epochs[-1]
            remote = self.session.remote_samples - self._remote_mark
            self._remote_mark = self.session.remote_samples
            if last.samples > 0:
                self._on_epoch(sched.pool, last, remote)

    def _on_epoch(self, pool: Any, last: Any, remote: int) -> None:
        x = self.watch.inputs
        steps: Sequence[StepCost] = ()
        profile = self.profile_fn()
        if profile is not None and profile.samples:
            try:
                steps = inputs_from_profile(profile, x.gthp, x.lthp, x.remote_workers).steps
            except ValueError as e:  # a NaN mean (offload.OffloadInputs): raised from the
                # scheduler thread it ended the epoch; the epoch is judged by throughput alone
                log.warning("headrace: the profile cannot be used to decide offloading "
                            "again: %s", e)
        obs = EpochObservation(samples=last.samples, wall_s=last.wall_s,
                               remote_samples=min(remote, last.samples), steps=steps)
        self.watch, why = check_epoch(self.cfg, self.watch, obs)
        if why is not None:
            lthp = local_capacity(self.watch, obs) if "throughput" in why else None
            workers = pool.own_workers if self.autoscaled and pool is not None else None
            self._replan(pool, why, remeasured(x, steps or None, lthp,
                                               obs.remote_samples > 0, workers))

    def _replan(self, pool: Any, why: str, x: OffloadInputs) -> None:
        decision = decide(x)
        self.watch = Watch(x, decision)
        session = self.session
        session.apply_offload(decision, worker_rate(x, decision), available=x.remote_workers)
        if pool is not None and not pool.closed:
            while len(session.remote_workers(pool)) < session.target:
                if session.add(pool) is None:
                    break
            while len(session.remote_workers(pool)) > session.target:
                if not session.retire(pool):
                    break
        self.history.append(Replan(time.monotonic() - self.t0, why, decision, session.target))
        del self.history[:-HISTORY_MAX]
