"""MDP's plan of one epoch for a loader's cache (its ``CacheSession``): the split of the budget
from a profile of the executed steps, or why there is none.

Functions of the session (as ``session_explain.py``'s): ``replan`` calls :func:`plan` once a
profile exists and no ``Cache.split`` is given.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from headrace.cache.config import redact
from headrace.cache.tiers import TierLayout
from headrace.pipeline.pipeline import Pipeline
from headrace.planner.cache_partition import (
    INF,
    DsiParams,
    best_split,
    kept_split,
    largest_form,
    params_from_profile,
    single_tier_splits,
)
from headrace.profiler.report import PipelineProfile

if TYPE_CHECKING:
    from headrace.cache.session import CacheSession


def last_split(self: CacheSession, layout: TierLayout) -> dict[str, float]:
    """The split the last epoch ran with, where what it stored still serves this job (the
    next epoch may keep it: ``cache_partition.kept_split``); empty otherwise: a Redis cache
    (a tier's budget there counts every job's entries, and jobs planning on the same numbers
    share them), a memory cache closed since (its files removed), forms keyed anew."""
    if self.config.url != "memory" or self.backend is None:
        return {}
    return self.split if layout.keyed_as(self.layout, self.split) else {}


def plan(self: CacheSession, executed: Pipeline, profile: PipelineProfile, workers: int,
         layout: TierLayout, forms: tuple[str, ...], last: dict[str, float]) -> None:
    """Set ``self.plan`` and ``self.split`` from MDP (``plan_best`` where it kept ``last``),
    or leave the default split where the profile lacks a step's measurements or B_cache
    cannot be measured (``plan_off`` says why)."""
    params = params_from_profile(profile, len(executed),
                                 {t.name: t.position for t in layout.tiers},
                                 max(1, workers), self.budget, INF, self.t_gpu)
    if params is not None:
        params = _with_bandwidth(self, params, forms)
    if params is None:
        return
    self.plan_t_gpu, self.plan_b_cache = params.t_gpu, params.b_cache
    best = best_split(params, forms)
    kept = kept_split(params, best, last, forms)
    if kept is not None and best.predicted > kept.predicted + 1e-9:  # (ties: best_split's
        self.plan_best = best  # margin; a tie was explained as "-1% faster": a review)
    self.plan = (kept or best, single_tier_splits(params, forms))
    self.split = self.plan[0].shares()


def _with_bandwidth(self: CacheSession, params: DsiParams,
                    forms: tuple[str, ...]) -> DsiParams | None:
    """``params`` with B_cache measured at the size of the largest allowed form; None (the
    default split this epoch, ``plan_off`` says why) when the server cannot be measured."""
    try:
        b = self.cache_bandwidth(largest_form(params, forms))
    except Exception as e:  # noqa: BLE001 - a server down: the cache copes, MDP waits
        self.plan_off = (f"B_cache could not be measured on the server ({type(e).__name__}: "
                         f"{redact(str(e))}); MDP plans at a later epoch")
        return None
    self.plan_off = None
    return dataclasses.replace(params, b_cache=b)
