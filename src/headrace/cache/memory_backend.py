"""The ``"memory"`` backend: one job's cache on tmpfs, in LMDB shards its worker processes share.

Each shard is one LMDB environment (``lmdb_store.LmdbStore``: entries read in place, exact byte
accounting, stale namespaces evicted first) holding the entries whose key hashes to it, with an
equal share of each tier's budget. Why shards: LMDB runs one write transaction at a time, and
storing a large form is mostly copying it into fresh tmpfs pages under that lock (about 0.3 ms
for an 800 KB decoded image). With one environment, 1, 2, 4 and 8 writer processes stored
2,858, 2,844, 3,216 and 3,290 such entries a second on two cores; with one shard per writer, 2
and 8 writers stored 4,916 and 5,400 (``python -m headrace.bench.cache_writes``,
docs/benchmarks.md "Cache writes"). So one environment caps a first epoch at about 3,000
samples a second, whatever the machine's cores. Writers of different shards do not wait for
each other; reads are as before (the key names its shard, which is read in place).

How many: one shard per ``CORES_PER_SHARD`` usable cores (at most ``MAX_SHARDS``, each holding
at least ``MIN_SHARD_BYTES``). A core running an imagenet-like pipeline makes about 250 inserts
a second, so one environment saturates near a dozen such cores; four cores per shard keeps its
lock about a third busy. On two cores that is one shard: two shards there left the demo job's
first epoch level (1.01x the time of one, 10 interleaved runs a side).

A shard's share of a tier is ``1/shards`` of the tier's budget, so one shard can be full while
another still has room. ``put`` then answers ``"shard_full"``, and ``"full"`` only once every
shard of the tier was found full in this process (since the last change of live namespaces,
which can make room), so a client does not stop storing while other shards have room.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from headrace.cache import shm_owner
from headrace.cache.lmdb_envs import close_envs
from headrace.cache.lmdb_store import LmdbStore, entry_cost

SHM_ROOT = "/dev/shm"
MAX_SHARDS = 16
"""The most LMDB environments one cache is split into."""
CORES_PER_SHARD = 4
"""Usable cores per shard (see the module docstring)."""
MIN_SHARD_BYTES = 128 << 20
"""A shard holds at least this much budget (bytes), so that its share of a tier holds a large
entry many times over (an entry larger than its shard's share is not stored). Smaller caches
have fewer shards (at least one)."""


def shard_count(budget_bytes: int, cpus: int) -> int:
    """Shards for a cache of ``budget_bytes`` on a machine with ``cpus`` usable cores: one per
    ``CORES_PER_SHARD`` cores, at most ``MAX_SHARDS``, each holding at least ``MIN_SHARD_BYTES``
    of budget, at least one."""
    return max(1, min(MAX_SHARDS, cpus // CORES_PER_SHARD, budget_bytes // MIN_SHARD_BYTES))


def split_budget(budget: int, shards: int) -> list[int]:
    """``budget`` (bytes) in ``shards`` shares that differ by at most one byte and sum to it."""
    q, r = divmod(budget, shards)
    return [q + (i < r) for i in range(shards)]


def split_tiers(budgets: dict[str, int], shards: int) -> list[dict[str, int]]:
    """Each shard's part of every tier's budget: each tier split evenly, its leftover bytes
    given one to a shard in turn, the turn carried from one tier to the next.

    So each tier's parts sum to its budget, and a shard's parts sum to at most its share of the
    whole (``split_budget``) whenever the tiers' budgets sum to at most the whole: the leftover
    bytes of all tiers together are dealt as ``split_budget`` deals its own. Leftovers given
    to the first shards for every tier would put more than its share in shard 0 (1,000 bytes
    in 3 shards: 334 for shard 0, but tiers of 500 and 500 would give it 167 + 167)."""
    parts: list[dict[str, int]] = [{} for _ in range(shards)]
    turn = 0
    for tier, budget in budgets.items():
        q, r = divmod(budget, shards)
        for i in range(shards):
            parts[i][tier] = q + ((i - turn) % shards < r)
        turn = (turn + r) % shards
    return parts


def make_dir() -> str:
    """A fresh private directory on tmpfs for this process's cache, locked by it and watched
    (``shm_owner``); removes the directories of dead owners first."""
    return shm_owner.make_dir(SHM_ROOT if os.path.isdir(SHM_ROOT) else None)


def remove_dir(path: str, owner_pid: int | None = None) -> None:
    """Delete a cache directory, its shards included (called by the owning loader on close and
    at exit), and in its owner stop its watcher. ``owner_pid``: only in that process; a
    process the user's code forked from it runs the finaliser at its exit too, and removed the
    live cache under the training process (which then went on without one)."""
    if owner_pid is not None and os.getpid() != owner_pid:
        return
    close_envs(path)
    shm_owner.remove_tree(path)
    shm_owner.release(path)


class MemoryBackend:
    """One job's cache under ``path``: ``shards`` LMDB environments (``path/shard-<i>``);
    picklable (each process opens the environments it uses itself).

    ``budget_bytes``: the job's budget, all tiers together, split evenly between the shards;
    ``set_budgets`` splits it between tiers (kept in LMDB, so every process sees the split at
    once). ``readers``: the most processes and threads reading at once (LMDB's reader table,
    per shard). ``shards``: ``None`` chooses :func:`shard_count` for this machine.
    """

    def __init__(self, path: str, budget_bytes: int, readers: int = 126,
                 shards: int | None = None) -> None:
        if shards is None:
            from headrace.planner.workers import available_cpus

            shards = shard_count(budget_bytes, available_cpus())
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self.path = path
        self.total_budget = budget_bytes
        self.readers = readers
        self.budgets: dict[str, int] = {}
        self.shards = [LmdbStore(os.path.join(path, f"shard-{i}"), b, readers)
                       for i, b in enumerate(split_budget(budget_bytes, shards))]
        self._full: dict[str, set[int]] = {}
        """Per tier, the shards this process found full since ``forget_full`` (a new epoch) or
        since ``live`` last changed."""
        self._live: frozenset[bytes] = frozenset()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "budget": self.total_budget, "readers": self.readers,
                "shards": len(self.shards), "budgets": self.budgets}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["budget"], state["readers"],  # type: ignore[misc]
                      state["shards"])
        self.budgets = state["budgets"]
        shares = split_tiers(self.budgets, len(self.shards))
        for store, share in zip(self.shards, shares, strict=True):
            store.budgets = share

    def _shard(self, key: bytes) -> int:
        return zlib.crc32(key) % len(self.shards) if len(self.shards) > 1 else 0

    def owner_gone(self) -> None:
        """In a worker whose training process died (SIGTERM, SIGKILL: no finaliser ran there):
        remove the cache's directory, which holds up to the cache budget of /dev/shm."""
        remove_dir(self.path)

    def remove_files(self) -> None:
        """Remove the cache's directory without closing this process's environments: from a
        worker's watchdog thread (``runtime/parent.py``) while another thread may be inside a
        transaction or reading an entry in place; the process ends next. Its mappings stay
        valid after the files are unlinked."""
        shm_owner.remove_tree(self.path)

    def close_here(self) -> None:
        """Close this process's environments (no transaction may be open); reopened on use."""
        for store in self.shards:
            store.close_here()

    # -- reads and writes ----------------------------------------------------------------------
    def get(self, key: bytes, decode: Callable[[Any], Any]) -> Any | None:
        """``decode(buffer)`` of the entry at ``key`` read in place, or None on a miss."""
        return self.shards[self._shard(key)].get(key, decode)

    def take(self, key: bytes, tier: str, decode: Callable[[Any], Any]) -> Any | None:
        """As ``get``, and the entry is removed (an augmented form served once)."""
        i = self._shard(key)
        value = self.shards[i].take(key, tier, decode)
        if value is not None:
            self._full.get(tier, set()).discard(i)  # it made room
        return value

    def put(self, key: bytes, tier: str, blob: bytes, live: Iterable[bytes]) -> str:
        """Store ``blob``: ``"stored"``, ``"exists"``, ``"shard_full"`` (its shard's share of
        the tier is full) or ``"full"`` (every shard's share is full, as this process found
        them, or the entry alone is larger than a shard's share).

        ``live``: namespaces still in use; others of this tier are evicted to make room (and
        of every tier when the shard's file is at its limit, ``lmdb_store.file_limit``).
        """
        live = frozenset(live)
        if live != self._live:  # another order or seeded epoch: stale entries make room now
            self._live, self._full = live, {}
        i = self._shard(key)
        full = self._full.setdefault(tier, set())
        if i not in full:
            r = self.shards[i].put(key, tier, blob, live)
            if r == "too_big":  # so in every shard (equal shares): as one environment said
                return "full"
            if r != "full":
                return r
            full.add(i)
        return "full" if len(full) == len(self.shards) else "shard_full"

    def forget_full(self) -> None:
        """Forget which shards were found full (the client calls it when the epoch changes:
        the training process may have raised a tier's budget, other processes freed room)."""
        self._full = {}

    def set_budgets(self, budgets: dict[str, int]) -> None:
        """(Re-)split the budget between tiers, for every process at once (kept in LMDB); a
        tier over its new share drops entries until it fits."""
        if sum(budgets.values()) > self.total_budget:
            raise ValueError(f"tier budgets {budgets} exceed the cache's {self.total_budget} bytes")
        for store, share in zip(self.shards, split_tiers(budgets, len(self.shards)), strict=True):
            store.set_budgets(share)
        self.budgets = dict(budgets)
        self._full = {}

    # -- accounting ----------------------------------------------------------------------------
    def budget(self, tier: str) -> int:
        """The tier's current share of the budget (bytes), all shards together."""
        return sum(store.budget(tier) for store in self.shards)

    def usage(self) -> dict[str, int]:
        """Bytes held per tier (headrace's accounting: ``entry_cost`` summed)."""
        total = dict.fromkeys(self.budgets, 0)
        for store in self.shards:
            for tier, used in store.usage().items():
                total[tier] = total.get(tier, 0) + used
        return total

    def scan_bytes(self) -> int:
        """Bytes of every entry recomputed by reading them all (for tests and checks)."""
        return sum(store.scan_bytes() for store in self.shards)

    def mapped_bytes(self) -> int:
        """Bytes of the LMDB files in use (pages up to the highest written one), all shards."""
        return sum(store.mapped_bytes() for store in self.shards)


__all__ = ["MAX_SHARDS", "MemoryBackend", "entry_cost", "make_dir", "remove_dir", "shard_count",
           "split_tiers"]
