"""Joining the Ray cluster, once per loader: whether remote workers are used at all, and how
many slots they get (``RemoteSession.open``, out of ``remote/session.py``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from headrace.errors import RemoteUnavailableError
from headrace.remote.config import unplaceable
from headrace.remote.storage import RESOURCE

if TYPE_CHECKING:
    from headrace.remote.session import RemoteSession

log = logging.getLogger("headrace")


def join(session: RemoteSession, may_join: bool = False) -> int:
    """Join the cluster once; the number of remote worker slots to reserve (0: none).

    A worker that no live node can hold now (``config.unplaceable``: a misspelt resource,
    or one that a cluster starting nodes on demand has not started yet) is named in a
    warning and in ``explain()``; the workers are still asked for, so that Ray's
    autoscaler (KubeRay) sees the demand and starts nodes, and the local workers run the
    samples meanwhile. Refusing it at join (an error with ``required=True``) kept such a
    cluster from ever scaling up (a review). ``may_join`` (``plan_offload``): the worker
    count follows the capacity there is, watched for nodes that join."""
    if session._opened:
        return session.max_workers if session.available else 0
    from headrace.remote import ray_backend  # the one place Ray gets imported

    cfg = session.cfg
    try:
        ray_backend.connect(cfg)
        problem = unplaceable(cfg, ray_backend.cluster_totals())
        if problem is not None:
            session.unplaced = problem
            log.warning("headrace: no remote worker can be placed on the Ray cluster %r "
                        "now: %s. A cluster that starts nodes on demand starts them for "
                        "the workers asked for; otherwise fix Remote(resources=..., "
                        "num_cpus=...). Local workers run the samples meanwhile",
                        cfg.address, problem)
    except RemoteUnavailableError as e:
        if cfg.required:
            raise  # and again at the next epoch: never silently local afterwards
        session._opened = True
        session.error = str(e).split(". Start one")[0].split(". Fix Remote(")[0]
        log.warning("%s; running on local workers only (Remote(required=False))", session.error)
        return 0
    session._opened = True
    session.available = True
    if cfg.max_workers is not None:
        session.max_workers = cfg.max_workers
    elif session.near_storage:  # one storage worker per num_cpus storage units
        session.max_workers = max(1, int(ray_backend.resource_total(RESOURCE) // cfg.num_cpus))
    else:
        session.max_workers = max(1, int(ray_backend.cluster_cpus() // cfg.num_cpus))
    default = 0 if cfg.autoplace else session.max_workers
    session.target = default if cfg.workers is None else min(cfg.workers, session.max_workers)
    return session.max_workers
