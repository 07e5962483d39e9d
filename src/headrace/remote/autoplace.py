"""AutoPlacement applied at run time (the policy itself is ``planner/placement.py``).

Ticked by the scheduler thread (``Monitor.tick_listeners``). Batch time is measured where the
training loop takes batches: the wall time between two ticks divided by the batches it took
in between (the training step included, as Pecan's bpt). While a remote worker the policy asked
for is still being placed (a Ray actor starting: seconds), or a local one waits for the training
thread to fork it (``runtime/forks.py``), nothing is measured: a window without the new
worker's help would say that adding it did not pay.

Moves are applied to the epoch's pool: remote workers through the session (``target`` too, so
the next epoch starts with the same count), local workers with ``pool.request_worker`` /
``pool.retire``. Without persistent workers every epoch has a new pool, started with
``num_workers`` local workers: once it has started them (``RemoteSession.attach``), the
controller brings it to the local count it had reached (``adopt``), so what it learned
survives the epoch boundary.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from headrace.planner.placement import Move, PlacementConfig, PlacementState, observe
from headrace.remote.session import RemoteSession

TIMELINE_MAX = 4096
"""Timeline points kept (oldest dropped: memory stays bounded)."""


@dataclasses.dataclass(frozen=True)
class PlacementPoint:
    """One window: ``t`` seconds since the controller started, the worker counts then, and the
    window's mean batch time ``bpt`` (seconds)."""

    t: float
    local: int
    remote: int
    bpt: float


class PlacementController:
    """Runs AutoPlacement for one loader across its epochs."""

    def __init__(self, session: RemoteSession, cfg: PlacementConfig, local: int,
                 batch_size: int) -> None:
        self.session = session
        self.cfg = cfg
        self.state = PlacementState(local=local, remote=session.target)
        self.batch_size = max(1, batch_size)
        self.moves: list[tuple[float, Move]] = []
        self.timeline: list[PlacementPoint] = []
        self.converged: tuple[int, int] | None = None
        """(local, remote) the policy last converged to (in its watch phase; a try of one
        remote worker fewer may be under way now)."""
        self.t0 = time.perf_counter()
        self._sched: Any = None
        self._batches = 0  # batches the current scheduler's epoch had delivered at the last tick
        self._t_last = 0.0

    def on_tick(self, sched: Any) -> None:
        now = time.perf_counter()
        batches = sched.consumed // self.batch_size
        pool = sched.pool
        if sched is not self._sched:  # a new epoch: its first batches include the start-up
            self._sched, self._batches, self._t_last = sched, batches, now
            return
        new = batches - self._batches
        placing = len(pool.requests) > 0 or any(  # a local worker not forked yet, or a remote
            w.external and not w.ready for w in list(pool.workers.values()))  # one starting
        if placing:
            self._batches, self._t_last = batches, now
            self.state = dataclasses.replace(self.state, acc=0.0, n=0)
            return
        if new <= 0:
            return
        per_batch = (now - self._t_last) / new
        self._batches, self._t_last = batches, now
        for _ in range(new):
            window_ends = self.state.n + 1 == self.cfg.window
            self.state, move = observe(self.cfg, self.state, per_batch)
            if window_ends:
                self._record(now)
            if move is not None:
                self.moves.append((now - self.t0, move))
                del self.moves[:-TIMELINE_MAX]
                self._apply(pool, move)
            if self.state.phase == "watch":
                self.converged = (self.state.local, self.state.remote)

    def _record(self, now: float) -> None:
        s = self.state
        self.timeline.append(PlacementPoint(now - self.t0, s.local, s.remote, s.last_bpt))
        del self.timeline[:-TIMELINE_MAX]

    def _apply(self, pool: Any, move: Move) -> None:
        session = self.session
        session.target = max(0, min(session.max_workers, session.target + move.remote))
        for _ in range(max(0, move.remote)):
            session.add(pool)
        for _ in range(max(0, -move.remote)):
            session.retire(pool)
        self._set_local(pool, self.state.local)

    def adopt(self, pool: Any) -> None:
        """A new epoch's pool, its ``num_workers`` local workers started: give it the local
        worker count the policy had reached (training thread, from ``RemoteSession.attach``)."""
        self._set_local(pool, self.state.local)

    def _set_local(self, pool: Any, n: int) -> None:
        """Add or retire local workers of ``pool`` until it has ``n`` (within its slots, at
        least ``min_local``)."""
        n = max(self.cfg.min_local, n)

        def local() -> list[Any]:
            return [w for w in list(pool.workers.values()) if not w.external and not w.retiring]

        while len(local()) + len(pool.requests) < n and pool.request_worker():
            pass  # forked by the training thread (runtime/forks.py)
        pool.requests.cancel(len(local()) + len(pool.requests) - n)  # asked for, not forked
        while len(local()) > n:
            pool.retire(min(local(), key=lambda w: len(w.assigned)))


def placement_tick(session: RemoteSession, sched: Any) -> None:
    """Every scheduler pass with ``Remote(autoplace=True)``: AutoPlacement's controller, made
    once the pool has started its local workers (it counts them), then ticked."""
    if session.placement is None:
        if session.local_started is None:
            return  # the pool is still starting its local workers: count them after
        cfg = PlacementConfig(
            max_remote=session.max_workers, max_local=max(1, sched.pool.local_slots),
            window=session.cfg.window, threshold=session.cfg.threshold,
            local_cost=session.cfg.local_cost_per_hour,
            remote_cost=session.cfg.cost_per_worker_hour)
        session.placement = PlacementController(session, cfg, max(1, session.local_started),
                                                sched.spec.batcher.batch_size or 1)
    session.placement.on_tick(sched)
