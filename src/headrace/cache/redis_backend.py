"""The ``"redis://host:port/db"`` backend: a real Redis server shared by jobs and nodes.

The client (``pip install headrace[redis]``) is imported here only. Values are raw blobs
(``codec``), never pickled: ``GET`` returns bytes that only ``codec.decode`` reads.

Budget: enforced by headrace, not by Redis refusing writes. An insert is one Lua script that
checks the tier's byte count against its budget and stores the entry and the count together, so
concurrent writers (workers, jobs) never overshoot. An entry counts ``entry_cost``: key and value
bytes plus ``OVERHEAD`` for Redis's own per-key structures (the allocator may round a value up
a little more; tests compare Redis's ``used_memory`` growth with the budget).

Failures: a call that fails (server gone, timeout) makes this process skip the server for its
next ``SKIP_CALLS`` calls (samples run uncached meanwhile, counted by the client); the call after
that tries again and reconnects through redis-py's pool. Nothing is lost: a missed lookup is a
recomputation. Counted in calls, not seconds, so a test can restart the server and know when
the loader will be back without sleeping.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from headrace.cache import ods_board
from headrace.cache.ods_board import META as ODS_META
from headrace.cache.ods_board import TIER_BIT

OVERHEAD = 64
"""Bytes Redis spends per key beside its name and value (dict entry, object headers)."""
SKIP_CALLS = 16
"""After a failure, calls this process answers as failed without trying the server."""
SOCKET_TIMEOUT_S = 1.0
"""Connect and read timeout of every call (seconds): a dead server costs at most this."""
PREFIX = b"hr:"

_PUT = """
local used = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
if used + tonumber(ARGV[2]) > tonumber(ARGV[3]) then return 'full' end
redis.call('SET', KEYS[1], ARGV[4])
redis.call('HINCRBY', KEYS[2], ARGV[1], ARGV[2])
return 'stored'
"""
_TAKE = """
local v = redis.call('GET', KEYS[1])
if v then
  redis.call('DEL', KEYS[1])
  redis.call('HINCRBY', KEYS[2], ARGV[1], -(string.len(v) + tonumber(ARGV[2])))
end
return v
"""


class BackendDown(ConnectionError):
    """The server failed recently; this process is not trying it again yet."""


def entry_cost(key_len: int, value_len: int) -> int:
    return key_len + value_len + OVERHEAD


class RedisBackend:
    """A Redis cache at ``url`` (``redis://host:port/db``); picklable, one client per process."""

    def __init__(self, url: str, budget_bytes: int) -> None:
        self.url = url
        self.total_budget = budget_bytes
        self.budgets: dict[str, int] = {}
        self._client: Any = None
        self._pid = -1
        self._skip = 0
        self.scripts: dict[str, Any] = {}
        self.ods: Any = None
        """``ods_board.OdsKeys`` when ODS is on (``Cache(ods=True)``), else None."""
        self.ods_tiers: frozenset[str] = frozenset()
        """Tiers whose entries ODS tracks (reference-counted reads, status on insert)."""

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "budget": self.total_budget, "budgets": self.budgets,
                "ods": self.ods, "ods_tiers": self.ods_tiers}

    def __setstate__(self, s: dict[str, Any]) -> None:
        self.__init__(s["url"], s["budget"])  # type: ignore[misc]
        self.budgets = s["budgets"]
        self.ods, self.ods_tiers = s.get("ods"), s.get("ods_tiers", frozenset())

    def _r(self) -> Any:
        if self._skip > 0:
            self._skip -= 1
            raise BackendDown(f"{self.url} failed recently; trying again in {self._skip} calls")
        if self._client is None or self._pid != os.getpid():
            import redis

            self._client = redis.Redis.from_url(
                self.url, socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=SOCKET_TIMEOUT_S, health_check_interval=0)
            self._put = self._client.register_script(_PUT)
            self._take = self._client.register_script(_TAKE)
            self.scripts = {name: self._client.register_script(text) for name, text in (
                ("ods_ask", ods_board.ASK), ("ods_get", ods_board.GET),
                ("ods_put", ods_board.PUT))}
            self._pid = os.getpid()
        return self._client

    def _call(self, f: Callable[[], Any]) -> Any:
        try:
            return f()
        except Exception:
            self._skip = SKIP_CALLS
            raise

    def get(self, key: bytes, decode: Callable[[Any], Any]) -> Any | None:
        r = self._r()
        blob = self._call(lambda: r.get(PREFIX + key))
        return None if blob is None else decode(blob)

    def take(self, key: bytes, tier: str, decode: Callable[[Any], Any]) -> Any | None:
        """Read and drop the entry (a shared augmented form is served once); with ODS on,
        read it and count a reference (dropped once every live job used it)."""
        if tier in self.ods_tiers:
            return self._ods_get(key, tier, decode)
        self._r()
        blob = self._call(lambda: self._take(keys=[PREFIX + key, PREFIX + b"used"],
                                             args=[tier, OVERHEAD + len(PREFIX + key)]))
        return None if blob is None else decode(blob)

    def put(self, key: bytes, tier: str, blob: bytes, live: Iterable[bytes]) -> str:
        """Store ``blob`` within the tier's budget: ``"stored"``, ``"exists"`` or ``"full"``.

        Entries of other namespaces are not evicted here (``live`` is unused): a shared server's
        namespaces belong to several jobs.
        """
        self._r()
        k = PREFIX + key
        cost = entry_cost(len(k), len(blob))
        budget = self.budgets.get(tier, 0)
        if tier in self.ods_tiers:
            cost += ODS_META
        if cost > budget:
            return "full"
        if tier in self.ods_tiers:
            script = self.scripts["ods_put"]
            r = self._call(lambda: script(
                keys=[k, PREFIX + b"used", self.ods.status],
                args=[tier, cost, budget, blob, int.from_bytes(key[-8:], "big"), TIER_BIT[tier]]))
            return r.decode() if isinstance(r, bytes) else str(r)
        r = self._call(lambda: self._put(keys=[k, PREFIX + b"used"],
                                         args=[tier, cost, budget, blob]))
        return r.decode() if isinstance(r, bytes) else str(r)

    def _ods_get(self, key: bytes, tier: str, decode: Callable[[Any], Any]) -> Any | None:
        self._r()
        k = PREFIX + key
        script = self.scripts["ods_get"]
        blob = self._call(lambda: script(
            keys=[k, PREFIX + b"used", self.ods.status, self.ods.jobs],
            args=[tier, len(k) + OVERHEAD + ODS_META, int.from_bytes(key[-8:], "big"),
                  TIER_BIT[tier]]))
        return None if blob is None else decode(blob)

    def set_budgets(self, budgets: dict[str, int]) -> None:
        if sum(budgets.values()) > self.total_budget:
            raise ValueError(f"tier budgets {budgets} exceed the cache's {self.total_budget} bytes")
        self.budgets = dict(budgets)

    def budget(self, tier: str) -> int:
        return self.budgets.get(tier, 0)

    def usage(self) -> dict[str, int]:
        r = self._r()
        raw = self._call(lambda: r.hgetall(PREFIX + b"used"))
        return {k.decode(): int(v) for k, v in raw.items()}

    def scan_bytes(self) -> int:
        """Bytes of every headrace entry recomputed by reading them all (tests and checks)."""
        r = self._r()
        total = 0
        for k in r.scan_iter(match=PREFIX + b"*", count=1000):
            if k == PREFIX + b"used" or k.startswith(PREFIX + b"ods:"):
                continue
            total += entry_cost(len(k), r.strlen(k)) + (ODS_META if self.ods else 0)
        return total

    def close_here(self) -> None:
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = None
