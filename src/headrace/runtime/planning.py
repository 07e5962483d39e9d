"""Applying the planner between epochs: profile store, AutoOrder, warm-up skipped on reuse.

The planner's policies are pure (``headrace.planner``); this module fetches their inputs (the
live profiler, the stored profile) and applies their outputs (the executed step order, the
timeout policy's starting point). Called by the loader at each epoch start and end.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import sys
import time
import weakref
from collections.abc import Sequence

from headrace.pipeline import Pipeline, Step
from headrace.planner.autoorder import stats_of
from headrace.planner.order import MIN_PROFILE_SAMPLES, PHASES, OrderPlan, Phase, plan_order
from headrace.profiler.report import PipelineProfile
from headrace.profiler.store import STORE_SCHEMA, ProfileKey, ProfileStore
from headrace.runtime.monitor import Monitor
from headrace.runtime.options import Options

log = logging.getLogger("headrace")

SAVE_EVERY_S = 10.0
"""Least seconds between two saves of a loader's profile to its store (the first epoch's is
saved at once): a save is a SQLite transaction of about 2 ms, and ``next(iter(loader))`` once
per step ends an epoch per step (it made each such call 3 ms instead of 1)."""
STORE_WAIT_S = 2.0
"""Longest a read or save waits for another process's lock on the store (seconds): a save
takes milliseconds, so a longer wait is a lock held elsewhere (a stuck job, a network file
system); the training loop waits for it (it waited 30 s per access before)."""


_live: weakref.WeakSet[Planning] = weakref.WeakSet()
"""The plannings of loaders alive, whose profiles the interpreter's exit keeps."""


@atexit.register
def _save_at_exit() -> None:
    """Interpreter exit: keep the profiles of loaders still alive (a script that ends inside
    an epoch, or without ``close()``). Saved later, by the finalisers that run while the
    interpreter tears its modules down, the save failed ("could not save the profile ...
    NameError: name 'open' is not defined", said at such exits:
    ``test_profile_store_files.py``), and the next run started without the profile."""
    for planning in list(_live):
        planning.after_epoch(now=True)


class Planning:
    def __init__(self, declared: Pipeline, options: Options, monitor: Monitor) -> None:
        _live.add(self)
        self.declared = declared
        self.executed = declared
        self.options = options
        self.monitor = monitor
        self.order: OrderPlan | None = None
        self.stored: PipelineProfile | None = None
        self.store: ProfileStore | None = None
        if options.profile and options.profile_store:
            path = None if options.profile_store is True else options.profile_store
            self.store = ProfileStore(path, timeout=STORE_WAIT_S)
        self.store_failed: str | None = None  # why the store is no longer used (explain())
        self._key: ProfileKey | None = None
        self._looked_up = False
        self._pinned: OrderPlan | None = None  # an order a state dict restored
        self._saved_at: float | None = None  # time.monotonic() of the last save
        self._saved: tuple[object, int, int] | None = None  # (profiler, samples, rejections)
        self.rejected: list[tuple[str, ...]] = []  # orders that did not hold (with the profile)
        self.note = "measured this run" if options.profile else "off (Options(profile=False))"

    @property
    def key(self) -> ProfileKey:
        """This job's key on the executor the workers run on now."""
        if self._key is None:
            self._key = ProfileKey.for_pipeline(self.declared)
        return dataclasses.replace(self._key, executor=self.monitor.executor or "processes")

    def decide(self) -> OrderPlan | None:
        """The order the next epoch would run, from the freshest profile (applies nothing)."""
        if self.monitor.profiler is None:
            return None
        self._lookup()
        live = self.monitor.profiler.report()
        need = min(MIN_PROFILE_SAMPLES, self.declared.length() or MIN_PROFILE_SAMPLES)
        if self.order is not None and self.order.phase == "validating":
            profile, source = live, "this run"  # validated on the order it runs, only
        elif live.samples >= need:
            profile, source = live, "this run"
        elif self.stored is not None and self.stored.samples >= need:
            profile, source = self.stored, "stored profile"
        else:  # too few yet: the larger count is reported
            profile, source = max((live, self.stored) if self.stored is not None else (live,),
                                  key=lambda p: p.samples), ""
        return plan_order(self.declared.steps, self.executed.steps, profile, source,
                          self.options.reorder, min_samples=need, embedded=self.declared.embedded,
                          previous=self.order, rejected=self.rejected,
                          broke=self.monitor.order_broke)

    @property
    def executed_names(self) -> tuple[str, ...]:
        """The executed step order, by name (``load`` excluded)."""
        return tuple(s.name for s in self.executed.steps)

    @property
    def phase(self) -> Phase:
        """AutoOrder's phase with the executed order (``planner/order.py``)."""
        return self.order.phase if self.order is not None else "undecided"

    def upcoming(self) -> tuple[tuple[str, ...], Phase]:
        """The step order (names) and phase the next epoch starts with: what a state dict
        taken between epochs records, so that a resume runs the epoch the uninterrupted run
        would have (plans now; applies nothing)."""
        plan = self._pinned if self._pinned is not None else self.decide()
        if plan is None:
            return self.executed_names, self.phase
        if plan is not self._pinned:
            # a state dict taken here records "kept": the resumed run would not see the
            # validation fail, so the order is recorded as rejected now
            self._if_rejected(plan)
        return tuple(s.name for s in plan.steps), plan.phase

    def restore(self, names: tuple[str, ...], phase: str | None = None) -> None:
        """Run the next epoch in the order a state dict saved (the order of the epoch it left
        unfinished, or between epochs the one the next epoch was to run), and go on from the
        AutoOrder ``phase`` it saved (``None``, saved before it was: AutoOrder decides again
        from the epoch after). An order that is not a permutation of this pipeline's steps (the
        script changed them) is ignored: the loader warned about the change already. The k-th
        step of a name in the saved order is the k-th declared step of that name: AutoOrder
        never swaps steps that share a name."""
        if sorted(names) != sorted(s.name for s in self.declared.steps):
            return
        by_name: dict[str, list[Step]] = {}
        for s in self.declared.steps:
            by_name.setdefault(s.name, []).append(s)
        nth = {n: iter(steps) for n, steps in by_name.items()}
        steps = tuple(next(nth[n]) for n in names)
        known: Phase = next((p for p in PHASES if p == phase), "undecided")
        said = {"undecided": "AutoOrder decides from the next profile of enough samples",
                "validating": "AutoOrder validates it on the next profile of enough samples",
                "kept": "AutoOrder had validated it: kept"}[known]
        self._pinned = OrderPlan(steps, None, f"order: as the loaded state dict recorded ({said})",
                                 known)

    def before_epoch(self) -> bool:
        """Choose this epoch's step order; True when it differs from the previous epoch's.
        The store is read first, whatever chooses the order: a resumed run whose state dict
        pins it read no stored profile (it redid the warm-up, and its smaller profile then
        replaced the stored one)."""
        if self.monitor.profiler is not None:
            self._lookup()
        pinned, self._pinned = self._pinned, None
        if pinned is not None:
            self.order = pinned
            steps = pinned.steps
        else:
            plan = self.decide()
            if plan is None:
                return False
            self._if_rejected(plan)
            self.order = plan
            steps = plan.steps
        if len(steps) == len(self.executed.steps) and all(
                a is b for a, b in zip(steps, self.executed.steps, strict=True)):
            return False
        self.executed = self.declared.with_steps(steps, self._kept_shape())
        self.monitor.new_profile(self.executed.step_names)  # a new order, a new profile
        self.monitor.order_broke = None  # (what the guard saw of the order before)
        if pinned is not None:
            log.info("headrace: resumed epoch runs the saved step order %s", " -> ".join(
                s.name for s in steps))
        else:
            log.info("headrace: %s", "; ".join(self.order.lines() if self.order else ()))
        return True

    def _kept_shape(self) -> list[int]:
        """Seed keys of the declared steps that kept dtype and shape on every profiled sample:
        from the decision of the order adopted, else (an order a state dict restored) from the
        freshest profile; none known without either (``pipeline/order_guard.py``)."""
        decision = self.order.decision if self.order is not None else None
        keeps: Sequence[bool] = decision.keeps_shape if decision is not None else ()
        if not keeps:
            profile = self.profile()
            if profile is None:
                return []
            keeps = [st is not None and st.keeps_shape
                     for st in stats_of(self.declared.steps, profile)]
        return [k for k, kept in zip(self.declared.keys[1:], keeps, strict=True) if kept]

    def after_epoch(self, now: bool = False) -> None:
        """Keep this run's profile for the next run of the same job: after the first epoch
        that measured samples, then at most once per ``SAVE_EVERY_S`` when it has grown, and
        when the loader closes (``now``) if it grew since. A stored profile of more samples
        stays (``ProfileStore.put(keep_larger=True)``): a resumed epoch's or a short run's
        profile replaced a larger one."""
        if self.monitor.order_broke is not None and self.executed.declared is not None:
            # a sample broke the order (the next boundary goes back, whatever the phase): kept
            # with the profile now, also where no boundary comes (a run's last epoch, a close)
            self._reject(self.executed_names)
        p = self.monitor.profiler
        # a new order starts a new profiler: one of as many samples as the last save's is new
        if self.store is None or p is None or self._saved == (p, p.samples, len(self.rejected)):
            return
        if sys.is_finalizing():  # the exit hook saved what there was: modules are going now
            return
        self._looked_up = True  # (read before this run measured; a read now finds its own save)
        t = time.monotonic()
        if not now and self._saved_at is not None and t - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at, self._saved = t, (p, p.samples, len(self.rejected))
        rate = self.monitor.last_consumer_rate()
        if rate is None and self.stored is not None:  # too short to measure: keep the last known
            rate = self.stored.consumer_rate
        report = dataclasses.replace(p.report(), consumer_rate=rate,
                                     rejected_orders=tuple(self.rejected))
        try:
            kept = self.store.put(self.key, report, keep_larger=True)
            newer = None if kept else self.store.newer_schema()
        except Exception as e:  # noqa: BLE001 - a broken cache must not break training
            self._give_up("save the profile to", e)
            return
        if newer is not None:  # read as empty and never written: every save would be lost
            self._stop(f"{self.store.path} was written by a newer headrace (store schema "
                       f"{newer}; this one writes {STORE_SCHEMA})")

    def _lookup(self) -> None:
        if self._looked_up or self.store is None:
            return
        self._looked_up = True
        try:
            self.stored = self.store.get(self.key)
        except Exception as e:  # noqa: BLE001
            self._give_up("read profiles from", e)
            return
        if self.stored is not None:
            self.rejected.extend(o for o in self.stored.rejected_orders if o not in self.rejected)
        if self.stored is not None and self.stored.samples:
            q = list(self.stored.total_quantiles)
            self.monitor.timeout.seed(q)
            self.monitor.known_step_p50 = {s.name: s.wall_p50 for s in self.stored.steps}
            self.monitor.stored_profile = self.stored
            self.note = (
                f"reused a stored profile of {self.stored.samples} samples from {self.store.path} "
                "(warm-up skipped)"
            )

    def _if_rejected(self, plan: OrderPlan) -> None:
        """``plan`` ends a validation that failed, or an order a sample broke (kept or not
        yet validated, ``OrderGuard``): record the order it ran as rejected."""
        if (self.order is not None and self.order.phase in ("validating", "kept")
                and plan.phase == "kept" and plan.decision is None
                and any(a is not b for a, b in zip(plan.steps, self.order.steps, strict=True))):
            self._reject(tuple(s.name for s in self.order.steps))

    def _reject(self, names: tuple[str, ...]) -> None:
        """AutoOrder's order ``names`` did not hold: remember it for this job's later runs, in
        the stored profile now (this run's own may stay smaller than it, and not replace it)
        and in every save of this run's."""
        if names in self.rejected:
            return
        self.rejected.append(names)
        if self.store is None:
            return
        try:  # merged into whatever profile is stored (the run's own save carries it too)
            self.store.add_rejected(self.key, names)
        except Exception as e:  # noqa: BLE001 - a broken cache must not break training
            self._give_up("save the profile to", e)

    def _give_up(self, what: str, e: Exception) -> None:
        """The store failed: warn once and use it no more in this loader (each later access
        would wait ``STORE_WAIT_S`` again, and fail the same way)."""
        assert self.store is not None
        self._stop(f"could not {what} {self.store.path} ({type(e).__name__}: {e})")

    def _stop(self, why: str) -> None:
        """Use the store no more, saying ``why`` once (a warning, and ``explain()``'s "not
        kept" line): it said "kept in" a store that a newer headrace had written, and that
        this run's saves never reached."""
        log.warning("headrace: %s; this loader keeps its profile in memory only", why)
        self.store_failed = why
        self.store = None

    def profile(self) -> PipelineProfile | None:
        p = self.monitor.profiler
        if p is not None and p.samples:
            return p.report()
        return self.stored
