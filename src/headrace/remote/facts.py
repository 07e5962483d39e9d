"""What ``explain()`` says about a loader's remote side (``planner.explain.RemoteFacts``),
gathered from its ``RemoteSession`` (no Ray here).

Remote workers count once placed and running: a proxy whose actor Ray has not placed (no node
with room for what it asks) is no worker, and used to be counted as one, so ``explain()`` said
"2 remote worker(s) now" of a loader that ran every sample locally.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headrace.remote.proxy_options import DRAWN_IN_A_ROW

if TYPE_CHECKING:
    from headrace.planner.explain import RemoteFacts
    from headrace.remote.session import RemoteSession
    from headrace.runtime.pool import WorkerPool


def started_and_placed(session: RemoteSession, pool: WorkerPool | None) -> tuple[int, int]:
    """Remote workers of ``pool`` started (not retiring), and of those the ones Ray placed
    and runs: a proxy whose actor was never placed is no worker (``explain()``, ``stats()``)."""
    workers = list(pool.workers.values()) if pool is not None and not pool.closed else []
    started = [w for w in workers if w.external and not w.retiring]
    placed = session.nodes()
    return len(started), sum(w.slot in placed for w in started)


def remote_facts(session: RemoteSession, pool: WorkerPool | None, steps: list[str],
                 measured_thp: float | None) -> RemoteFacts:
    """``session``'s facts over ``pool`` (the running or persistent one; None between epochs),
    ``steps`` the executed step names, ``measured_thp`` the last epoch's samples/s."""
    from headrace.planner.explain import RemoteFacts

    workers = list(pool.workers.values()) if pool is not None and not pool.closed else []
    started, remote = started_and_placed(session, pool)  # placed and running, not only asked
    local = sum(not w.external and not w.retiring for w in workers)
    cfg = session.cfg
    extra = [f"  remote workers: {started} started, {remote} placed so far: Ray has found "
             f"no node with room for the others (each asks for num_cpus={cfg.num_cpus:g}, "
             f"resources={dict(cfg.resources or {})})"] if remote < started else []
    if session.unplaced is not None and not remote:
        extra.append("  no remote worker could be placed when the cluster was joined: "
                     + session.unplaced)
    if session.cache_on:  # docs/design.md: a known limit
        extra.append(f"  cache: remote workers do not use the sample cache: {session.uncached} "
                     "sample(s) they ran from the start were not looked up there, nor were the "
                     "forms they made stored")
    if session.loaded_again:  # Remote(read_source=False): docs/design.md
        drew = session.load_drew
        whys = [f"{session.loaded_again - drew} as the loaded value does not pickle, or "
                "parts of it share memory"] if session.loaded_again > drew else []
        if drew:
            whys.append(f"{drew} as the load drew from a global random generator, which the "
                        "training process does not seed per sample")
        why = "; ".join(whys)
        extra.append(f"  local load: {session.loaded_again} sample(s) loaded for remote workers "
                     f"were not sent ({why}): local workers loaded them again and ran them "
                     "whole")
    if session.load_draws.stopped:
        extra.append(f"  local load: the proxies load no more samples, as {DRAWN_IN_A_ROW} of "
                     "their loads in a row drew from a global random generator: remote "
                     "workers take no sample that starts at the load, for the loader's life"
                     + (f" ({session.not_loaded} sample(s) taken before were handed back "
                        "unloaded: local workers ran them whole)" if session.not_loaded
                        else ""))
    if not workers:  # between epochs without persistent workers ("0 local" before): the
        # counts the next epoch starts with (``attach``, ``adopt``), remote ones only once
        # Ray has placed one of them (else the cluster has no room for them)
        remote = session.target if session.placed_total else 0
        local = (session.placement.state.local if session.placement is not None
                 else session.local_started or 0)
        if session.target and not session.placed_total:
            extra.insert(0, f"  remote workers: {session.target} asked for, none placed yet: "
                            f"Ray has found no node with room for one (num_cpus="
                            f"{cfg.num_cpus:g}, resources={dict(cfg.resources or {})})")
    cost = None
    if cfg.local_cost_per_hour is not None and cfg.cost_per_worker_hour is not None:
        cost = cfg.local_cost_per_hour + cfg.cost_per_worker_hour * remote
    moves = tuple((t, m.local, m.remote, m.bpt, m.reason)
                  for t, m in (session.placement.moves if session.placement else []))
    replans = tuple((r.t, r.reason, r.decision.describe(), r.remote_workers)
                    for r in (session.watcher.history if session.watcher else []))
    return RemoteFacts(
        address=cfg.address, error=session.error, max_workers=session.max_workers,
        remote_workers=remote, local_workers=local,
        remote_samples=session.remote_samples, lost=session.lost, split=session.stop,
        never_started=session.starts.total, start_error=session.starts.cause,
        gave_up=session.starts.gave_up,
        steps=tuple(steps), offload=session.offload, autoplace=cfg.autoplace, moves=moves,
        measured_thp=measured_thp, cost_per_hour=cost, replans=replans,
        handed_off=session.handed_off_remote, handed_back=session.handed_back_remote,
        link=session.link.describe() if session.link is not None else None,
        watching=session.watcher is not None, read_local=session.read_local,
        extra=tuple(extra) + (tuple(session.near.lines()) if session.near is not None else ()))
