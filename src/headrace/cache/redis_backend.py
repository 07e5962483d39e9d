"""The ``"redis://host:port/db"`` backend (``rediss://``, ``unix://`` too): a real Redis server
shared by jobs and nodes.

The client (``pip install headrace[redis]``) is imported here only. Values are raw blobs
(``codec``), never pickled: ``GET`` returns bytes that only ``codec.decode`` reads.

Budget: enforced by headrace, not by Redis refusing writes. An insert first reserves its bytes
with one Lua script that checks the tier's byte count against its budget and charges it, so
concurrent writers (workers, jobs) never overshoot; then it sets the value. Values never pass
through a script (``redis_scripts`` says why and how). An entry counts ``entry_cost``: key and value
bytes plus ``OVERHEAD`` for Redis's own per-key structures (the allocator may round a value up
a little more; tests compare Redis's ``used_memory`` growth with the budget). The budget is at
most what the server has room for (``redis_limits``, read when the loader opens).

Past the server's ``maxmemory`` (``noeviction``), Redis refuses every command queued in a
``MULTI``, a ``GET`` included: a lookup then sends its ``GET`` and bookkeeping script in a plain
pipeline (``_plain``), whose ``GET`` Redis serves; an insert refused for memory (its reservation
or its ``SET``) gives its bytes back and answers ``"full"``. Under an evicting policy each stored
entry's cost is kept in a ledger, written in the ``MULTI`` of its ``SET`` (``store``), so a
lookup that finds an entry evicted gives its bytes back, and one between another job's
reservation and its ``SET`` gives nothing (``redis_scripts``).

Failures: the process skips the server for a number of calls (``redis_outage``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from headrace.cache import ods_board, redis_scripts
from headrace.cache.config import redact
from headrace.cache.ods_board import META as ODS_META
from headrace.cache.ods_board import TIER_BIT
from headrace.cache.redis_limits import ServerLimits
from headrace.cache.redis_outage import BackendDown, Outage

OVERHEAD = 64
"""Bytes Redis spends per key beside its name and value (dict entry, object headers)."""
SOCKET_TIMEOUT_S = 1.0
"""Connect and read timeout of every call (seconds): a dead server costs at most this."""
PLAIN_READS = 32
"""After a ``MULTI`` refused for memory, lookups this process sends as plain pipelines before it
tries a ``MULTI`` again (a refused one costs a round trip)."""
LEDGER_META = 100
"""Bytes counted per entry, beside it, for its record in its namespace's ledger (Redis's
``used_memory`` grew by 99.7 bytes per ``"<bytes>:<expiry>"`` field of a 20,000-field hash);
under an evicting policy only."""
PREFIX = b"hr:"

USED = PREFIX + b"used"
NAMESPACES = PREFIX + b"ns"
NS_USED = PREFIX + b"nsused:"
ENTRY_KEY_LENS = (len(PREFIX) + 24, len(PREFIX) + 33)
"""An entry's key: the prefix, a 16-byte namespace and an 8-byte index, or a 17-byte key for a
sampler key that is not an integer below 2^64 (``tiers.sample_key``; never with ODS, whose
samplers yield each index of ``range(len(dataset))``)."""
DEFAULT_TTL_S = 6 * 3600.0
"""Entries and namespaces expire this long after their last insert or hit (``Cache.redis_ttl_s``)."""


def entry_cost(key_len: int, value_len: int) -> int:
    return key_len + value_len + OVERHEAD


class RedisBackend:
    """A Redis cache at ``url`` (``redis://host:port/db``); picklable, one client per process.

    ``allow_oom``: the server takes script flags (Redis >= 7): the bookkeeping runs past
    ``maxmemory``; ``ledger``: the server may evict entries (``redis_limits.ServerLimits``).
    """

    budgets_per_process = True
    """Its tier budgets (``set_budgets``) and ODS's tiers are this process's: a persistent
    worker process sets the training process's anew at each epoch (``epoch_client.py``)."""

    def __init__(self, url: str, budget_bytes: int, ttl_s: float = DEFAULT_TTL_S, *,
                 allow_oom: bool = False, ledger: bool = False) -> None:
        self.url = url
        self.total_budget = budget_bytes
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.allow_oom = allow_oom
        self.ledger = ledger
        self._plain_reads = 0
        self.budgets: dict[str, int] = {}
        self._client: Any = None
        self._pid = -1
        self.outage = Outage()
        """This process's calls left to answer as failed (``redis_outage``)."""
        self.scripts: dict[str, Any] = {}
        self.ods: Any = None
        """``ods_board.OdsKeys`` when ODS is on (``Cache(ods=True)``), else None."""
        self.ods_tiers: frozenset[str] = frozenset()
        """Tiers whose entries ODS tracks (reference-counted reads, status on insert)."""
        self.ods_always: frozenset[str] = frozenset()
        """ODS tiers evicted at the threshold even when not full (a shared augmented form)."""

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "budget": self.total_budget, "budgets": self.budgets,
                "ods": self.ods, "ods_tiers": self.ods_tiers, "ods_always": self.ods_always,
                "ttl_ms": self.ttl_ms, "allow_oom": self.allow_oom, "ledger": self.ledger}

    def __setstate__(self, s: dict[str, Any]) -> None:
        self.__init__(s["url"], s["budget"], s["ttl_ms"] / 1000,  # type: ignore[misc]
                      allow_oom=s.get("allow_oom", False), ledger=s.get("ledger", False))
        self.budgets = s["budgets"]
        self.ods, self.ods_tiers = s.get("ods"), s.get("ods_tiers", frozenset())
        self.ods_always = s.get("ods_always", frozenset())

    def _r(self) -> Any:
        self.outage.check(redact(self.url))
        if self._client is None or self._pid != os.getpid():
            import redis

            client = redis.Redis.from_url(
                self.url, socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=SOCKET_TIMEOUT_S, health_check_interval=0)
            self._client = client
            self.scripts = {name: client.register_script(
                redis_scripts.flagged(name, text, self.allow_oom)) for name, text in (
                ("reserve", redis_scripts.RESERVE), ("refund", redis_scripts.REFUND),
                ("confirm", redis_scripts.CONFIRM), ("touch", redis_scripts.TOUCH),
                ("drop", redis_scripts.DROP), ("ods_use", redis_scripts.ODS_USE),
                ("ods_ask", ods_board.ASK))}
            self._pid = os.getpid()
        return self._client

    def _call(self, f: Callable[[], Any]) -> Any:
        """``f()``; a failure of the server makes this process skip it for a while (not a
        refusal for memory: the server is there, and serves reads)."""
        from redis.exceptions import OutOfMemoryError

        try:
            return f()
        except (BackendDown, OutOfMemoryError):
            raise  # skipped, not tried: the count goes on; or answered
        except Exception as e:
            self.outage.failed(e)
            raise

    def _keys(self, key: bytes, ods: bool) -> tuple[list[bytes], bytes]:
        """The scripts' ``KEYS`` for entry ``key`` (``redis_scripts``' convention) and the
        entry's namespace."""
        ns = key[:-8]
        keys = [PREFIX + key, USED, NAMESPACES, NS_USED + ns]
        if ods:
            keys += [self.ods.status, self.ods.jobs]
        return keys, ns

    def _run(self, script: str, key: bytes, tier: str, *args: Any, ods: bool = False,
             client: Any = None) -> Any:
        """Run a bookkeeping script on ``key`` (on ``client``: a pipeline to queue it in)."""
        r = self._r()
        keys, ns = self._keys(key, ods)
        led = "1" if self.ledger else "0"
        if client is not None:  # EVALSHA queued as is: see _multi
            return client.evalsha(self.scripts[script].sha, len(keys), *keys, tier,
                                  self.ttl_ms, ns, NS_USED, led, *args)
        return self.scripts[script](keys=keys, args=[tier, self.ttl_ms, ns, NS_USED, led, *args],
                                    client=r)

    def _multi(self, queue: Callable[[Any], None]) -> list[Any]:
        """Run the commands ``queue(pipe)`` adds in one ``MULTI`` (one round trip).

        Scripts are queued as plain ``EVALSHA``: redis-py's script objects would first ask the
        server whether they are loaded (``SCRIPT EXISTS``), a second round trip per lookup.
        A server that has not seen them yet (or restarted since) answers ``NOSCRIPT``: they are
        loaded and the call is retried once (the ``MULTI`` ran its ``GET`` anyway: harmless).
        """
        from redis.exceptions import NoScriptError

        r = self._r()
        for attempt in (0, 1):
            pipe = r.pipeline(transaction=True)
            queue(pipe)
            try:
                return list(pipe.execute())
            except NoScriptError:
                if attempt:
                    raise
                for script in self.scripts.values():
                    r.script_load(script.script)
        raise AssertionError("unreachable")

    def _plain(self, queue: Callable[[Any], None]) -> Any:
        """The first reply of the commands ``queue(pipe)`` adds, sent in a pipeline without
        ``MULTI`` (one round trip, not atomic): Redis past ``maxmemory`` refuses every command
        of a ``MULTI`` but serves a plain ``GET``. A bookkeeping script refused there (before
        Redis 7) or not loaded is skipped this once."""
        from redis.exceptions import NoScriptError

        r = self._r()
        pipe = r.pipeline(transaction=False)
        queue(pipe)
        first, *rest = pipe.execute(raise_on_error=False)
        if any(isinstance(x, NoScriptError) for x in rest):
            for script in self.scripts.values():
                r.script_load(script.script)
        if isinstance(first, Exception):
            raise first
        return first

    def _read(self, key: bytes, script: str, tier: str, *args: Any, ods: bool = False) -> Any:
        """``GET`` the entry and run ``script``'s bookkeeping after it, in one ``MULTI`` (in a
        plain pipeline while the server refuses a ``MULTI`` for memory)."""
        from redis.exceptions import OutOfMemoryError

        def queue(pipe: Any) -> None:
            pipe.get(PREFIX + key)
            self._run(script, key, tier, *args, ods=ods, client=pipe)

        if self._plain_reads > 0:
            self._plain_reads -= 1
            return self._call(lambda: self._plain(queue))
        try:
            return self._call(lambda: self._multi(queue))[0]
        except OutOfMemoryError:
            self._plain_reads = PLAIN_READS
            return self._call(lambda: self._plain(queue))

    def _beside(self) -> int:
        """Bytes an entry counts beside its key, value and ``OVERHEAD``: its ledger record."""
        return LEDGER_META if self.ledger else 0

    def get(self, key: bytes, decode: Callable[[Any], Any]) -> Any | None:
        """The entry (its TTL refreshed), or None."""
        blob = self._read(key, "touch", "")
        return None if blob is None else decode(blob)

    def take(self, key: bytes, tier: str, decode: Callable[[Any], Any]) -> Any | None:
        """Read and drop the entry (a shared augmented form is served once); with ODS on,
        read it and count a use (dropped once every live job used it)."""
        extra = len(PREFIX + key) + OVERHEAD + self._beside()
        if tier in self.ods_tiers:
            blob = self._read(key, "ods_use", tier, extra + ODS_META,
                              int.from_bytes(key[-8:], "big"), TIER_BIT[tier],
                              "1" if tier in self.ods_always else "0", ods=True)
        else:
            blob = self._read(key, "drop", tier, extra)
        return None if blob is None else decode(blob)

    def put(self, key: bytes, tier: str, blob: bytes, live: Iterable[bytes]) -> str:
        """Store ``blob`` within the tier's budget: ``"stored"``, ``"exists"`` or ``"full"``
        (also when the server refuses it for memory): ``reserve``, then ``store``.

        Entries of other namespaces are not evicted here (``live`` is unused): a shared server's
        namespaces belong to several jobs; those no job uses any more expire (``ttl``).
        """
        res, cost, at = self.reserve(key, tier, len(blob))
        return self.store(key, tier, blob, cost, at) if res == "stored" else res

    def reserve(self, key: bytes, tier: str, size: int) -> tuple[str, int, list[int]]:
        """Charge the tier for a ``size``-byte value of ``key`` (``RESERVE``): ``"stored"``
        (the bytes are charged: ``store`` next), ``"exists"`` or ``"full"``; the bytes
        charged and, with ODS, the entry's index and tier bit (``store``'s ``at``)."""
        from redis.exceptions import OutOfMemoryError

        cost = entry_cost(len(PREFIX + key), size) + self._beside()
        budget = self.budgets.get(tier, 0)
        ods = tier in self.ods_tiers
        if ods:
            cost += ODS_META
        if cost > budget:
            return "full", cost, []
        at = [int.from_bytes(key[-8:], "big"), TIER_BIT[tier]] if ods else []
        try:
            res = self._call(lambda: self._run("reserve", key, tier, cost, budget, *at, ods=ods))
        except OutOfMemoryError:
            return self._refused(key, tier, 0, at), cost, at
        return (res.decode() if isinstance(res, bytes) else str(res)), cost, at

    def store(self, key: bytes, tier: str, blob: bytes, cost: int, at: list[int]) -> str:
        """``SET ... NX`` the value ``reserve`` charged ``cost`` bytes for: ``"stored"``;
        ``"exists"`` (another writer was first: the bytes go back); ``"full"`` (refused for
        memory: the bytes go back). With the ledger the ``SET`` follows ``CONFIRM`` in one
        ``MULTI``, which records the entry only if the ``SET`` stores it."""
        from redis.exceptions import OutOfMemoryError

        r = self._r()

        def queue(pipe: Any) -> None:
            self._run("confirm", key, tier, cost, client=pipe)
            pipe.set(PREFIX + key, blob, px=self.ttl_ms, nx=True)

        try:
            if self.ledger:
                res = self._call(lambda: self._multi(queue))[0]
                return res.decode() if isinstance(res, bytes) else str(res)
            if self._call(lambda: r.set(PREFIX + key, blob, px=self.ttl_ms, nx=True)):
                return "stored"
        except OutOfMemoryError:
            return self._refused(key, tier, cost, at)
        self._call(lambda: self._run("refund", key, tier, cost))  # another writer was first
        return "exists"

    def _refused(self, key: bytes, tier: str, cost: int, at: list[int]) -> str:
        """An insert the server refused for memory: its ``cost`` reserved bytes back, the tier
        marked full, an ODS status cleared (``REFUND``). Before Redis 7 that is refused too: the
        bytes stay counted until their namespace expires."""
        from redis.exceptions import OutOfMemoryError

        try:
            self._call(lambda: self._run("refund", key, tier, cost, "1", *at, ods=bool(at)))
        except OutOfMemoryError:
            pass
        return "full"

    def set_budgets(self, budgets: dict[str, int]) -> None:
        if sum(budgets.values()) > self.total_budget:
            raise ValueError(f"tier budgets {budgets} exceed the cache's {self.total_budget} bytes")
        self.budgets = dict(budgets)

    def budget(self, tier: str) -> int:
        return self.budgets.get(tier, 0)

    def usage(self) -> dict[str, int]:
        r = self._r()
        raw = self._call(lambda: r.hgetall(USED))
        return {k.decode(): int(v) for k, v in raw.items()}

    def scan_bytes(self) -> int:
        """Bytes of every headrace entry recomputed by reading them all (tests and checks)."""
        r = self._r()
        total = 0
        for k in r.scan_iter(match=PREFIX + b"*", count=1000):
            if len(k) not in ENTRY_KEY_LENS:
                continue  # bookkeeping: used, ns, nsused:*, ods:*
            total += (entry_cost(len(k), r.strlen(k)) + (ODS_META if self.ods else 0)
                      + self._beside())
        return total

    def close_here(self) -> None:
        if self._client is not None and self._pid == os.getpid():
            self._client.close()
        self._client = None


def read_limits(url: str) -> ServerLimits:
    """The memory limits of the server at ``url`` (``redis_limits`` says what each is for),
    read with a short-lived client; where it cannot be reached, ``ServerLimits.error``."""
    import redis
    from redis.backoff import NoBackoff
    from redis.exceptions import ResponseError
    from redis.retry import Retry

    # one try: a server that does not answer costs the loader's construction one timeout,
    # not redis-py's default retries (four in all)
    client = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S,
                                  socket_connect_timeout=SOCKET_TIMEOUT_S,
                                  retry=Retry(NoBackoff(), 0))
    try:
        maxmemory: int | None = None
        policy, source = None, ""
        try:
            cfg = _text(client.config_get("maxmemory*"))
            if "maxmemory" in cfg:
                maxmemory, policy = int(cfg["maxmemory"]), cfg.get("maxmemory-policy")
                source = "CONFIG GET"
        except ResponseError:  # refused (managed Redis): INFO has both
            pass
        try:
            info = _text(client.info("memory"))
        except ResponseError:
            info = {}
        if maxmemory is None and "maxmemory" in info:
            maxmemory, policy, source = (int(info["maxmemory"]), info.get("maxmemory_policy"),
                                         "INFO memory")
        counted = sum(int(v) for v in client.hvals(USED))
        try:
            client.script_load(redis_scripts.ALLOW_OOM + "return 1")
            allow_oom = True
        except ResponseError:  # before Redis 7: a syntax error
            allow_oom = False
        used = info.get("used_memory")
        return ServerLimits(maxmemory, policy, None if used is None else int(used), counted,
                            allow_oom, source)
    except Exception as e:  # noqa: BLE001 - unreachable now: the backend copes (and counts)
        return ServerLimits(None, None, None, 0, False, error=f"{type(e).__name__}: {redact(str(e))}")
    finally:
        client.close()


def _text(d: dict[Any, Any]) -> dict[str, Any]:
    return {(k.decode() if isinstance(k, bytes) else k):
            (v.decode() if isinstance(v, bytes) else v) for k, v in d.items()}
