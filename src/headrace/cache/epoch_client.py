"""The cache client a worker uses in the running epoch, for workers that outlive an epoch.

The cache plans every epoch anew (``CacheSession.replan``): its keys (namespaces) hash the
source and the steps as they are at the epoch's start, and MDP may give the budget to other
forms once a profile exists. A pool's workers got one client when they started, so persistent
workers (``persistent_workers=True``) kept the first epoch's plan: worker threads, which share
the training process's dataset and module globals, were served the first epoch's forms after the
script changed the dataset or a step's global between epochs (a bug hunt: 32 of 32 stale hits),
and worker processes never used a form MDP chose later.

What reaches a worker, and why not the same for threads and processes:

* a worker **thread** runs the objects the training process plans from, so it takes the
  epoch's whole client (keys and active forms): ``EpochCache.current``;
* a worker **process** runs its own copy of the dataset and the steps' globals, taken when it
  started (torch's persistent workers keep theirs too: a change the script makes later is not
  seen there), so its keys stay those of the epoch it started in (the pool hands the epoch's
  client to the workers it starts: ``runtime/epochs.py``); keying it by the training process's
  new state would store forms of the old state under the new state's keys, to be served to a
  worker running the new state (a replacement, a later pool) or to another job on a shared
  Redis. Only which forms have a budget, and the budgets (a Redis backend keeps them per
  process), reach it: through shared memory (:class:`EpochCache`), read when the plan's number
  changed.

A worker checks at every task (``TaskRunner.run``): one shared integer read and compared,
0.4 µs; a worker process builds a new client once an epoch (3.5 µs; docs/design.md).
"""

from __future__ import annotations

import os
from typing import Any

from headrace.cache.client import CacheClient, Counters
from headrace.cache.tiers import TIERS, TierLayout


class EpochCache:
    """One cache session's plan as its workers read it (made with the ``multiprocessing``
    context ``ctx``, shared with worker processes like the counters).

    Shared values: the plan's number (bumped by each :meth:`publish`, 0: none yet), then each
    tier's budget in bytes, in the order of ``TIERS`` (a tier with a budget is active).
    ``current``: the epoch's client, for worker threads (never pickled: a process has its own
    objects)."""

    def __init__(self, ctx: Any) -> None:
        self.values = ctx.RawArray("q", 1 + len(TIERS))
        self.pid = os.getpid()
        """The training process, whose worker threads take ``current``."""
        self.current: EpochClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"values": self.values, "pid": self.pid}

    def __setstate__(self, s: dict[str, Any]) -> None:
        self.values, self.pid, self.current = s["values"], s["pid"], None

    def publish(self, client: EpochClient, budgets: dict[str, int]) -> None:
        """The plan of a starting epoch: ``client`` (made by the session for it) and each
        tier's budget (bytes). The number is written last; workers read it at a task of the
        new epoch, which is sent after this (no torn read)."""
        for i, name in enumerate(TIERS):
            self.values[1 + i] = budgets.get(name, 0) if name in client.active else 0
        self.values[0] += 1
        client.number = self.values[0]
        self.current = client

    @property
    def number(self) -> int:
        return int(self.values[0])

    def budgets(self) -> dict[str, int]:
        """Each active tier's budget (bytes)."""
        return {name: int(self.values[1 + i]) for i, name in enumerate(TIERS)
                if self.values[1 + i] > 0}


class EpochClient(CacheClient):
    """A ``CacheClient`` that knows its session's :class:`EpochCache` (``plan``) and which of
    its plans it follows (``number``), so a worker can tell when to take another."""

    def __init__(self, layout: TierLayout, backend: Any, counters: Counters,
                 active: tuple[str, ...], plan: EpochCache | None, number: int = 0) -> None:
        super().__init__(layout, backend, counters, active)
        self.active = tuple(active)
        self.plan = plan
        self.number = number

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "epoch_plan": (self.plan, self.number, self.active)}

    def __setstate__(self, s: dict[str, Any]) -> None:
        s = dict(s)
        self.plan, self.number, self.active = s.pop("epoch_plan")
        super().__setstate__(s)


def for_epoch(client: Any) -> Any:
    """The client a worker uses for its next task: ``client`` itself while its session has no
    newer plan; in a worker thread, the session's client of the running epoch; in a worker
    process, ``client``'s keys with the running epoch's active tiers and budgets (module
    docstring). ``None`` and plain clients are returned as they are."""
    plan = getattr(client, "plan", None)
    if plan is None:
        return client
    if os.getpid() == plan.pid:  # a thread of the training process: the epoch's own objects
        current = plan.current
        return current if current is not None else client
    number = plan.number
    if number == client.number:
        return client
    backend, budgets = client.backend, plan.budgets()
    active = tuple(budgets)
    if getattr(backend, "budgets_per_process", False):  # Redis: its budgets and ODS's tiers
        backend.set_budgets(budgets)
        if getattr(backend, "ods", None) is not None:
            backend.ods_tiers = ods_tiers(client.layout, active)
    return EpochClient(client.layout, backend, client.counters, active, plan, number)


def ods_tiers(layout: TierLayout, active: tuple[str, ...]) -> frozenset[str]:
    """The tiers ODS tracks in an epoch: its exact forms (not one seeded for one epoch only)
    that have a budget."""
    return frozenset(t.name for t in layout.tiers
                     if not (t.seeded and not t.shared) and t.name in active)
