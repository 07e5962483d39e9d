"""One LMDB environment on tmpfs: a shard of the ``"memory"`` backend (``memory_backend``).

Why LMDB: it is a well-kept, multi-process-safe, memory-mapped store. Readers in every worker
process read entries in place from the shared mapping (no pickles through a pipe, no copy
before ``codec.decode`` makes the step's private value); writers are serialised by LMDB's
own lock, so the byte accounting below is exact across processes. Its files live on
``/dev/shm`` (tmpfs): the cache is memory and goes away with the machine or with ``close()``.

Budget: headrace counts every entry at what it occupies in LMDB (``entry_cost``: key, value and
node header, page-rounded for large values, which LMDB keeps on their own pages) and keeps each
tier's total under its share of the store's budget. The file is held to the budget plus a slack
(``file_limit``: 1/16 of it, at least 1 MiB), since a file on tmpfs holds every page it ever
wrote in memory, however few entries are left in them: that limit is LMDB's ``map_size``, past
which LMDB writes nothing (``MDB_MAP_FULL``). The entries alone did not bound the file: LMDB
reuses a freed page only two write transactions later, and a large entry needs one run of
contiguous free pages, which entries of other sizes freed here and there seldom leave (entries
of 100 KB-1.5 MB replaced every epoch grew the file to 1.25x a 128 MiB budget in 20 epochs,
2.3x an 8 MiB one); entries under a page share B-tree leaf pages that random keys leave 60-70%
full (1.66x). So an insert also checks the pages the file holds (entries and B-trees, LMDB's
own counts) against ``file_room``, the limit less a reserve where a delete finds the pages it
copies on write; and where LMDB finds no run long enough, every stale entry is evicted in a
transaction of its own, one more is committed (then LMDB may reuse those pages) and the insert
is tried once more (after clearing the read slots of processes gone: a worker killed inside
``get`` pinned every page its snapshot saw, and the store then raised ``MDB_MAP_FULL`` from its
evictions instead of answering "full"). Readers are safe throughout: LMDB reuses no page a
reader's snapshot can see, and ``get`` decodes (copies) inside its read transaction.

Readers that lag (``lmdb_readers``): a write that LMDB finds no pages for waits until no
reader's snapshot predates the last commit, and is tried once more; a ``put`` still without
pages is "full", and a ``take`` whose delete finds none is a miss: the entry stays (a stale
namespace's entry is evicted later), and is not served, so that it is not served twice.

When an entry does not fit, entries of namespaces no longer live (a changed prefix after
AutoOrder, an earlier epoch of a seeded form) are evicted first; live entries are never
evicted for other live ones: under uniform random sampling every sample is equally likely to
be asked for next, so swapping one cached sample for another gains nothing and costs a write.

Fork safety: an LMDB environment must not be used across ``fork()``, and py-lmdb refuses to
open in a child a file its parent had open at the fork. So each process opens its own
(``lmdb_envs``: one per process and path), and the training process closes its own
(``close_here``)
before worker processes fork, unless it runs samples itself (``num_workers=0``: no fork).
Every operation runs inside ``lmdb_envs.Use``: a close waits for the threads inside the
environment, and one after the cache closed for good raises ``lmdb_envs.StoreClosed``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any

from headrace.cache import lmdb_envs, lmdb_readers
from headrace.cache.lmdb_envs import PAGE, write_lock

NODE_MAX = 2000
"""Entries larger than this (key + value, bytes) go to their own overflow pages in LMDB."""
NODE_HEADER = 16
"""Per-entry overhead of an LMDB leaf node plus its slot pointer (bytes, rounded up)."""
FILE_SLACK = 1 / 16
"""The LMDB file may exceed the store's budget by this fraction of it (at least
``FILE_SLACK_MIN`` bytes): LMDB's own pages (B-tree, free list), pages freed by the last two
write transactions (not reusable yet) and free pages too scattered to hold a large entry."""
FILE_SLACK_MIN = 1 << 20
RESERVE_FRACTION = 1 / 4
"""The part of the slack that inserts leave free (``LmdbStore.file_room``): pages a delete
copies on write (and LMDB's free list records) are found there when the file is at its
limit, so that evictions and ``take`` never fail for want of pages."""

_U64 = struct.Struct("<Q")


def entry_cost(key_len: int, value_len: int) -> int:
    """Bytes an entry occupies in LMDB: small ones in a leaf page, large ones on whole pages."""
    size = key_len + value_len + NODE_HEADER
    if size <= NODE_MAX:
        return size
    return key_len + NODE_HEADER + -(-(value_len + 16) // PAGE) * PAGE


def file_limit(budget: int) -> int:
    """Bytes the LMDB file of a store with ``budget`` bytes may reach: LMDB's ``map_size``,
    which LMDB never writes past (``MDB_MAP_FULL``), so the file on tmpfs holds at most this
    much memory."""
    limit = budget + max(int(budget * FILE_SLACK), FILE_SLACK_MIN)
    return -(-limit // PAGE) * PAGE


class LmdbStore:
    """One LMDB environment at ``path`` (a directory, created on first use); picklable (each
    process opens the environment itself).

    ``budget_bytes``: the store's budget, all tiers together; ``set_budgets`` splits it (kept
    in LMDB, so every process sees the split at once). ``readers``: the most processes and
    threads reading at once (LMDB's reader table).
    """

    def __init__(self, path: str, budget_bytes: int, readers: int = 126) -> None:
        self.path = path
        self.total_budget = budget_bytes
        self.budgets: dict[str, int] = {}
        self.readers = max(126, readers)
        self.file_room = file_limit(budget_bytes) - int(
            (file_limit(budget_bytes) - budget_bytes) * RESERVE_FRACTION)
        """Bytes of pages the entries, LMDB's B-tree and an insert may hold together."""
        self.map_size = file_limit(budget_bytes)
        """LMDB's ``map_size`` (bytes): ``file_limit`` of the budget."""
        self.waits_given_up = 0
        """Waits for readers (``_wait_for_readers``) that ended with one still inside (count)."""

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "budget": self.total_budget, "readers": self.readers,
                "budgets": self.budgets}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["budget"], state["readers"])  # type: ignore[misc]
        self.budgets = state["budgets"]

    def close_here(self) -> None:
        """Close this process's environment (once no thread is inside it); reopened on use."""
        lmdb_envs.close_env(self.path)

    def _use(self) -> lmdb_envs.Use:
        """``with self._use() as (env, data, meta):`` one operation (``lmdb_envs.Use``)."""
        return lmdb_envs.Use(self.path, self.map_size, self.readers)

    def _dbs(self) -> tuple[Any, Any, Any]:
        """This process's (environment, data db, meta db), no operation counted in them: for
        tests and checks that look inside."""
        return lmdb_envs.open_env(self.path, self.map_size, self.readers)

    # -- reads ---------------------------------------------------------------------------------
    def get(self, key: bytes, decode: Callable[[Any], Any]) -> Any | None:
        """``decode(buffer)`` of the entry at ``key`` read in place, or None on a miss."""
        with self._use() as (env, data, _), env.begin(db=data, buffers=True) as txn:
            buf = txn.get(key)
            return None if buf is None else decode(buf)

    def take(self, key: bytes, tier: str, decode: Callable[[Any], Any]) -> Any | None:
        """As ``get``, and the entry is removed (an augmented form served once); a miss when
        LMDB finds no pages for the delete even after readers left (module docstring)."""
        import lmdb

        with self._use() as (env, data, meta), write_lock(self.path):
            try:
                return self._take(env, data, meta, key, tier, decode)
            except lmdb.MapFullError:  # readers' snapshots hold the pages freed lately
                pass
            try:
                self._wait_for_readers(env)
                return self._take(env, data, meta, key, tier, decode)
            except lmdb.MapFullError:  # the entry stays, unserved: served once at most
                return None

    def _take(self, env: Any, data: Any, meta: Any, key: bytes, tier: str,
              decode: Callable[[Any], Any]) -> Any | None:
        with env.begin(write=True, buffers=True) as txn:
            buf = txn.get(key, db=data)
            if buf is None:
                return None
            value = decode(buf)
            cost = entry_cost(len(key), len(buf))
            txn.delete(key, db=data)
            self._add(txn, meta, tier, key[:16], -cost)
            return value

    # -- writes --------------------------------------------------------------------------------
    def put(self, key: bytes, tier: str, blob: bytes, live: Iterable[bytes]) -> str:
        """Store ``blob``; ``"stored"``, ``"exists"``, ``"full"`` (no room left in the tier's
        budget or in the file) or ``"too_big"`` (the entry alone exceeds the tier's budget).

        ``live``: namespaces still in use; others are evicted to make room.
        """
        import lmdb

        cost = entry_cost(len(key), len(blob))
        live_set = set(live)
        with self._use() as (env, data, meta), write_lock(self.path):
            try:
                return self._put(env, data, meta, key, tier, blob, live_set, cost)
            except lmdb.MapFullError:  # no run of free pages long enough (see the docstring)
                pass
            try:
                # readers' snapshots hold the pages freed lately (a reader killed inside get(),
                # a hung worker's, every page it saw): wait for them, then make room
                waited = self._wait_for_readers(env)
                if not (self._evict_all_stale(env, data, meta, live_set) or waited):
                    return "full"
                return self._put(env, data, meta, key, tier, blob, live_set, cost)
            except lmdb.MapFullError:  # the evictions too found no pages: full, not an error
                return "full"

    def _put(self, env: Any, data: Any, meta: Any, key: bytes, tier: str, blob: bytes,
             live: set[bytes], cost: int) -> str:
        with env.begin(write=True) as txn:
            budget = self._budget(txn, meta, tier)
            if cost > budget:
                return "too_big"
            if txn.get(key, db=data) is not None:
                return "exists"
            used = self._used(txn, meta, tier)
            if used + cost > budget:
                used -= self._evict_stale(txn, data, meta, tier, live, used + cost - budget)
                if used + cost > budget:
                    return "full"
            over = _pages_held(txn, data, meta) * PAGE + cost - self.file_room
            if over > 0:
                over -= self._evict_stale(txn, data, meta, None, live, over)
                if over > 0:
                    return "full"
            txn.put(key, blob, db=data)
            self._add(txn, meta, tier, key[:16], cost)
            return "stored"

    def _wait_for_readers(self, env: Any) -> bool:
        """``lmdb_readers.wait``, counting a wait given up (``waits_given_up``)."""
        found, gave_up = lmdb_readers.wait(env, self.path)
        self.waits_given_up += gave_up
        return found

    def _evict_all_stale(self, env: Any, data: Any, meta: Any, live: set[bytes]) -> bool:
        """Evict every entry of a namespace not in ``live``, in a transaction of its own, then
        commit one more, so that LMDB may reuse the freed pages in the next (see the module
        docstring); False when there was none."""
        with env.begin(write=True) as txn:
            if not self._evict_stale(txn, data, meta, None, live, 1 << 62):
                return False
        with env.begin(write=True) as txn:  # a write of its own: only then can the next
            self._touch(txn, meta)  # transaction take the pages freed above
        return True

    def set_budgets(self, budgets: dict[str, int]) -> None:
        """(Re-)split the budget, for every process at once (kept in LMDB); a tier over its
        new share drops entries until it fits."""
        if sum(budgets.values()) > self.total_budget:
            raise ValueError(f"tier budgets {budgets} exceed the cache's {self.total_budget} bytes")
        import lmdb

        with self._use() as (env, data, meta), write_lock(self.path):
            try:
                self._write_budgets(env, data, meta, budgets)
            except lmdb.MapFullError:  # readers' snapshots hold pages (see put)
                self._wait_for_readers(env)
                self._write_budgets(env, data, meta, budgets)  # still full: the session drops
                # the cache with a warning (runtime/epochs.py)
        self.budgets = dict(budgets)

    def _write_budgets(self, env: Any, data: Any, meta: Any, budgets: dict[str, int]) -> None:
        with env.begin(write=True) as txn:
            for tier in set(self.budgets) | set(budgets):
                b = budgets.get(tier, 0)
                txn.put(b"b:" + tier.encode(), _U64.pack(b), db=meta)
                over = self._used(txn, meta, tier) - b
                if over > 0:
                    self._evict_stale(txn, data, meta, tier, set(), over)

    def budget(self, tier: str) -> int:
        """The tier's current share of the budget (bytes)."""
        with self._use() as (env, _, meta), env.begin(db=meta) as txn:
            return self._budget(txn, meta, tier)

    def usage(self) -> dict[str, int]:
        """Bytes held per tier (headrace's accounting: ``entry_cost`` summed)."""
        with self._use() as (env, _, meta), env.begin(db=meta) as txn:
            return {t: self._used(txn, meta, t) for t in self.budgets}

    def scan_bytes(self) -> int:
        """Bytes of every entry recomputed by reading them all (for tests and checks)."""
        total = 0
        with self._use() as (env, data, _), env.begin(db=data, buffers=True) as txn:
            for k, v in txn.cursor():
                total += entry_cost(len(k), len(v))
        return total

    def mapped_bytes(self) -> int:
        """Bytes of the LMDB file in use (pages up to the highest written one)."""
        with self._use() as (env, _, _):
            return (env.info()["last_pgno"] + 1) * env.stat()["psize"]

    # -- accounting ----------------------------------------------------------------------------
    @staticmethod
    def _budget(txn: Any, meta: Any, tier: str) -> int:
        v = txn.get(b"b:" + tier.encode(), db=meta)
        return _U64.unpack(v)[0] if v is not None else 0

    @staticmethod
    def _used(txn: Any, meta: Any, tier: str) -> int:
        v = txn.get(b"u:" + tier.encode(), db=meta)
        return _U64.unpack(v)[0] if v is not None else 0

    @staticmethod
    def _touch(txn: Any, meta: Any) -> None:
        """A write, so that the transaction commits (LMDB commits none for an empty one): it
        counts how often the file was reclaimed (``_evict_all_stale``)."""
        v = txn.get(b"x:reclaims", db=meta)
        txn.put(b"x:reclaims", _U64.pack((_U64.unpack(v)[0] if v is not None else 0) + 1),
                db=meta)

    def _add(self, txn: Any, meta: Any, tier: str, ns: bytes, delta: int) -> None:
        tkey = b"u:" + tier.encode()
        txn.put(tkey, _U64.pack(max(0, self._used(txn, meta, tier) + delta)), db=meta)
        nkey = b"n:" + ns
        v = txn.get(nkey, db=meta)
        n_used = (_U64.unpack(v[:8])[0] if v is not None else 0) + delta
        if n_used <= 0:
            txn.delete(nkey, db=meta)
        else:
            txn.put(nkey, _U64.pack(n_used) + tier.encode(), db=meta)

    def _evict_stale(
        self, txn: Any, data: Any, meta: Any, tier: str | None, live: set[bytes], need: int
    ) -> int:
        """Delete entries of this tier's namespaces (every tier's: ``None``) not in ``live``
        (all of them when ``live`` is empty: a budget cut) until ``need`` bytes are freed;
        returns the bytes freed."""
        victims = []
        with txn.cursor(db=meta) as cur:
            if cur.set_range(b"n:"):
                for k, v in cur:
                    if not k.startswith(b"n:"):
                        break
                    ns, owner = bytes(k[2:]), bytes(v[8:]).decode()
                    if (tier is None or owner == tier) and ns not in live:
                        victims.append((ns, owner))
        freed = 0
        for ns, owner in victims:
            with txn.cursor(db=data) as cur:
                if not cur.set_range(ns):
                    continue
                while freed < need and bytes(cur.key()[:16]) == ns:
                    k, v = cur.item()
                    c = entry_cost(len(k), len(v))
                    self._add(txn, meta, owner, ns, -c)
                    freed += c
                    if not cur.delete():
                        break
            if freed >= need:
                break
        return freed


def _pages_held(txn: Any, data: Any, meta: Any) -> int:
    """Pages of the file in use in ``txn``: the entries and both databases' B-trees, plus the
    two meta pages and the main database's page (LMDB's free list is in the reserve)."""
    held = 3
    for db in (data, meta):
        st = txn.stat(db)
        held += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
    return held
