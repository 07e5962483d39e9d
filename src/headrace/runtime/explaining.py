"""What ``loader.explain()`` reports, gathered from a running loader (``runtime/loader.py``)
into ``planner.explain.Facts``, which ``planner/explain.py`` words."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace import units
from headrace.planner.executor import MIN_PROBED_S
from headrace.planner.explain import Facts
from headrace.runtime import epochs, ordering

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader


def facts(loader: DataLoader) -> Facts:
    """The loader's decisions and the numbers behind them (a map-style dataset's loader)."""
    assert loader.pipeline is not None and loader.planning is not None
    pl, monitor = loader.planning, loader.monitor
    stats = loader.stats()
    running = stats.epochs[len(monitor.epochs):]  # the epoch under way, if one is
    return Facts(
        fingerprint=loader.pipeline.fingerprint(),
        samples=loader.pipeline.length(),
        batch_size=loader.batch_size,
        workers="auto" if loader.autoscale else loader.num_workers,
        batching=ordering.describe(epochs.batch_mode(loader), loader.in_order,
                                  epochs.delivered_by_index(loader)),
        declared=tuple(loader.pipeline.step_names),
        executed=tuple(pl.executed.step_names),
        order=pl.order,
        next_order=pl.decide(),
        handoff=loader.options.handoff and loader.pipeline.splittable and loader.num_workers > 0,
        handoff_off=handoff_off(loader),
        stats=stats,
        samples_done=monitor.samples_closed + sum(e.samples for e in running),
        running=bool(running),
        timeout_samples=monitor.timeout.window_samples,
        timeout_stored=monitor.timeout.window_stored,
        scale_decisions=tuple(monitor.scaler.decisions) if monitor.scaler else (),
        profile=pl.profile(),
        profile_note=profile_note(pl, started=bool(stats.epochs)),
        cache_lines=tuple(loader.cache.explain_lines(
            loader.pipeline.opaque or loader.pipeline.embedded, monitor.epochs))
        if loader.cache else (f"cache: off: {loader._cache_off}",) if loader._cache_off else (),
        remote=_remote_facts(loader),
        executor=_executor_line(loader),
        start_note=monitor.start_note,
        move_cost_s=monitor.move_cost_s,
        collate=loader._collate_place.describe() if loader._collate_place else None,
        messages=monitor.messages_line()  # deeper queues: local processes only
        if loader.num_workers and loader._executor == "processes" and loader.remote is None
        else None,
    )


def profile_note(pl: Any, started: bool) -> str:
    """Where the profile comes from and where it is kept; before any epoch (``started``
    False), with nothing stored read, nothing was measured or kept yet."""
    if not started and pl.note == "measured this run":
        where = (f"; to be kept in {pl.store.path}" if pl.store is not None else
                 f"; not kept: {pl.store_failed}" if pl.store_failed else "")
        return "not measured yet (no epoch started)" + where
    return pl.note + (f"; kept in {pl.store.path}" if pl.store is not None else
                      f"; not kept: {pl.store_failed}" if pl.store_failed else "")


def _executor_line(loader: DataLoader) -> str | None:
    if loader.options.executor != "auto":
        return None
    d = loader.monitor.executor_decision
    if d is None:
        probed = loader.monitor._executor_probes.probed_s
        return (f'executor="auto": running {loader._executor}, measuring how much of the '
                f"steps' time holds the GIL ({units.duration(probed)} of step time measured; "
                f"it decides at {units.duration(MIN_PROBED_S)})")
    applied = ("" if d.executor == loader._executor
               else f" (from the next epoch; {loader._executor} until then)")
    return d.describe() + applied


def _remote_facts(loader: DataLoader) -> Any:
    if loader.remote is None or not loader.remote._opened:
        return None
    it = loader._iterator_ref()
    pool = it.pool if it is not None and hasattr(it, "pool") else loader._pool
    last = loader.monitor.epochs[-1] if loader.monitor.epochs else None
    assert loader.planning is not None
    return loader.remote.facts(pool, loader.planning.executed.step_names,
                               last.samples_per_s if last is not None else None)


def handoff_off(loader: DataLoader) -> str:
    """Why the slow lane is off, in words ("" where it is on)."""
    assert loader.pipeline is not None
    if not loader.options.handoff:
        return "handoff=False"
    if loader.num_workers == 0:
        return "num_workers=0: samples run in the training loop, with no worker to move one to"
    if loader.pipeline.embedded:
        return "the steps run inside the dataset's __getitem__: a sample cannot be split there"
    if not loader.pipeline.splittable:
        return "a single step per sample: nothing to hand off between steps"
    return ""
