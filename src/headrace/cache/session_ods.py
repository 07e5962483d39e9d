"""ODS's part of a loader's cache session (training process): which forms ODS tracks in an
epoch, under which shared keys, and the job's board and running epoch.

``CacheSession.replan`` calls :func:`plan` with the epoch's layout and active tiers;
``CacheSession.start_ods`` takes the job's board (:func:`board`, one per loader) and each
epoch's :func:`epoch`. Imported by the session only when ``Cache(ods=True)``.
"""

from __future__ import annotations

from typing import Any

from headrace.cache.epoch_client import ods_tiers
from headrace.cache.tiers import TierLayout


def plan(backend: Any, layout: TierLayout, active: tuple[str, ...]) -> None:
    """Set ``backend``'s ODS keys and tracked tiers for an epoch of ``layout`` whose tiers
    with a budget are ``active``."""
    from headrace.cache.ods_board import OdsKeys
    from headrace.cache.redis_backend import PREFIX

    # keyed by each tracked form's namespace (active or not: the job leaves the live jobs of
    # those it does not look up this epoch): jobs of any pipeline that cache one form share
    # its entries, its uses and its threshold (``ods_board``); an exact or shared form's
    # namespace is the same in every epoch and for every seed
    tracked = [t for t in layout.tiers if not (t.seeded and not t.shared)]
    backend.ods = OdsKeys(PREFIX, {t.name: t.namespace(0, 0) for t in tracked})
    backend.ods_tiers = ods_tiers(layout, active)
    backend.ods_always = frozenset(t.name for t in tracked if t.shared)


def board(backend: Any, job: str, ttl_s: float) -> Any:
    """The job's ``ods_board.OdsBoard`` on ``backend`` (``job``: ``Cache.job``; ``ttl_s``:
    ``Cache.ods_ttl_s``, seconds)."""
    from headrace.cache.ods_board import OdsBoard

    return OdsBoard(backend, backend.ods, job, ttl_s)


def epoch(board: Any, number: int, delivered: Any) -> Any:
    """The ``ods_epoch.OdsEpoch`` of epoch ``number`` (``delivered``: the indices a resumed
    epoch delivered before, else None)."""
    from headrace.cache.ods_epoch import OdsEpoch

    return OdsEpoch(board, number, delivered)
