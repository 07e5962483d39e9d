"""The Redis cache against a server's own limits: maxmemory under noeviction and an evicting
policy, a server that refuses CONFIG, passwords in what headrace prints, other URL schemes.

The session's server is given a small ``maxmemory`` with ``CONFIG SET`` by the ``limited``
fixture, which restores it (no limit, ``noeviction``) after the test.
"""

from __future__ import annotations

import logging
import os
import time

import pytest

import headrace as hr
from headrace.cache import client as cache_client
from headrace.cache import redis_limits
from headrace.cache.redis_backend import LEDGER_META, RedisBackend, entry_cost, read_limits
from headrace.cache.tiers import sample_key
from tests.integration.test_cache import N, pipeline, samples

pytestmark = [pytest.mark.integration, pytest.mark.redis]


@pytest.fixture
def limited(redis_server):
    """A client of the session's server, whose limits the test sets; restored after."""
    import redis

    redis_server.flush()
    redis_limits._warned.clear()  # warned once per process: not by an earlier test
    r = redis.Redis.from_url(redis_server.url)
    yield r
    r.config_set("maxmemory", 0)
    r.config_set("maxmemory-policy", "noeviction")
    redis_server.flush()
    r.close()


def _cap(r, room: int, policy: str) -> None:
    """``maxmemory`` at ``room`` bytes above what the server holds now."""
    r.config_set("maxmemory-policy", policy)
    r.config_set("maxmemory", r.info("memory")["used_memory"] + room)


def _fill(r, most: int = 2000) -> None:
    """Another application's keys until the server refuses one (noeviction)."""
    import redis

    for k in range(most):  # bounded: a 4 MB room takes about 200
        try:
            r.set(b"other:%d" % k, os.urandom(20_000))
        except redis.exceptions.OutOfMemoryError:
            return
    raise AssertionError("the server did not refuse")


def test_lookups_hit_past_maxmemory_and_a_refused_insert_is_full_not_counted(
        limited, redis_server, no_leaks) -> None:
    # Redis refuses every command of a MULTI past maxmemory, its GET included: a lookup read
    # nothing again once the server was full (0 hits, every lookup an error; a bug hunt)
    _cap(limited, 4 << 20, "noeviction")  # a few MB: each connection takes ~20 KB
    cache = hr.Cache(url=redis_server.url, budget_bytes=1 << 20, split={"decoded": 1.0})
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=2,
                           options=hr.Options(seed=5, cache=cache))
    samples(loader)
    stored = loader.stats().last.cache.inserts
    assert stored == N
    _fill(limited)  # another application fills the server: Redis refuses writes now
    samples(loader)
    c = loader.stats().last.cache
    assert (c.hits, c.errors) == (N, 0)
    be = loader.cache.backend
    held = be.usage()["decoded"]
    assert held == be.scan_bytes()
    # an insert past maxmemory answers "full" and leaves the count as it was
    key = sample_key(loader.cache.layout.get("decoded").namespace(0, 0), N + 1)
    assert be.put(key, "decoded", b"\0" * 1000, []) == "full"
    assert be.usage()["decoded"] == held
    loader.close()


def test_a_set_refused_for_memory_gives_its_reservation_back(limited, redis_server) -> None:
    # the reservation passes (the server is under its limit), the SET's 400 KB take it over:
    # its bytes stayed counted (hr:used 637070 while 603540 were held; a bug hunt)
    _cap(limited, 300_000, "noeviction")  # each connection takes ~20-60 KB of it
    limits = read_limits(redis_server.url)
    assert limits.allow_oom  # Redis >= 7 (the project's CI server): flags are taken
    be = RedisBackend(redis_server.url, 8 << 20, allow_oom=True)
    be.set_budgets({"decoded": 8 << 20})
    assert be.put(sample_key(b"n" * 16, 1), "decoded", os.urandom(400_000), []) == "full"
    assert limited.zscore(b"hr:ns", b"n" * 16) is not None  # it was reserved, then refused
    assert be.usage().get("decoded", 0) == 0 == be.scan_bytes()
    be.close_here()


def test_the_budget_is_capped_at_what_the_server_has_room_for(limited, redis_server,
                                                              caplog) -> None:
    # the default budget for a Redis URL was 25% of the *local* memory (6 GB against a 64 MB
    # server; a bug hunt)
    _cap(limited, 4 << 20, "noeviction")
    url = redis_server.url
    default = hr.DataLoader(pipeline(), batch_size=8, options=hr.Options(
        seed=1, cache=hr.Cache(url=url)))
    assert 0.5 * (4 << 20) < default.cache.budget <= redis_limits.SERVER_SHARE * (4 << 20)
    assert "maxmemory" in default.explain()
    default.close()
    with caplog.at_level(logging.WARNING, logger="headrace"):
        big = hr.DataLoader(pipeline(), batch_size=8, options=hr.Options(
            seed=1, cache=hr.Cache(url=url, budget_bytes=1 << 30)))
    assert big.cache.budget <= redis_limits.SERVER_SHARE * (4 << 20)
    assert any("room for" in r.getMessage() for r in caplog.records)
    assert "capped" in big.explain()
    big.close()


def test_a_server_refusing_config_is_read_from_info_and_its_password_never_printed(
        limited, redis_server, caplog) -> None:
    # managed Redis refuses CONFIG: INFO memory has maxmemory; and the password of a URL was
    # printed by explain() and repr(Options) (a bug hunt)
    _cap(limited, 4 << 20, "volatile-lru")
    secret = "s3cr3t-pw"
    for user, denied in (("hr_noconfig", ["-config"]), ("hr_blind", ["-config", "-info"])):
        limited.acl_setuser(user, enabled=True, passwords=[f"+{secret}"], keys=["*"],
                            categories=["+@all"], commands=denied)
    port = redis_server.port
    try:
        url = f"redis://hr_noconfig:{secret}@127.0.0.1:{port}/0"
        limits = read_limits(url)
        assert (limits.source, limits.policy) == ("INFO memory", "volatile-lru")
        assert limits.maxmemory == int(limited.config_get("maxmemory")["maxmemory"])
        blind = read_limits(f"redis://hr_blind:{secret}@127.0.0.1:{port}/0")
        assert blind.maxmemory is None and blind.evicts  # unknown: the ledger is kept
        options = hr.Options(seed=1, cache=hr.Cache(url=url, budget_bytes=1 << 20))
        with caplog.at_level(logging.WARNING, logger="headrace"):
            loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=0, options=options)
            samples(loader)
        assert loader.stats().last.cache.inserts == N
        printed = [loader.explain(), repr(options), repr(options.cache),
                   *(r.getMessage() for r in caplog.records)]
        assert any("may evict" in p for p in printed)
        assert all(secret not in p for p in printed)
        assert "hr_noconfig:***@" in loader.explain()
        loader.close()
    finally:
        limited.acl_deluser("hr_noconfig", "hr_blind")


def test_entries_redis_evicts_give_their_bytes_back(limited, redis_server, no_leaks,
                                                     monkeypatch) -> None:
    # under an evicting policy (volatile-lru, ElastiCache's default) the count kept the bytes
    # of entries Redis had evicted: 2.98 MB counted while 0.47 MB was held, inserts refused
    # as full (a bug hunt)
    # every lookup made (a lookup is how an evicted entry's bytes come back): the cache's cost
    # rule skipped one whose round trip, on a loaded machine, measured dearer than the share
    # of hits it would save (one full run of three this stop). Workers fork after this.
    monkeypatch.setattr(cache_client, "PROBE_EVERY", 1)
    _cap(limited, 2 << 20, "volatile-lru")
    cache = hr.Cache(url=redis_server.url, budget_bytes=1 << 20, split={"decoded": 1.0})
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=2,
                           options=hr.Options(seed=5, cache=cache))
    samples(loader)
    assert loader.stats().last.cache.inserts == N
    be = loader.cache.backend
    # the server's limit lowered under what it holds: Redis evicts entries (the only keys
    # with a TTL) until it is under; then the limit is back and there is room again
    room = limited.config_get("maxmemory")["maxmemory"]
    limited.config_set("maxmemory", limited.info("memory")["used_memory"] - 8_000)
    limited.config_set("maxmemory", room)
    left = be.scan_bytes()
    assert 0 < left < be.usage()["decoded"]  # the count still holds what was evicted
    samples(loader)  # every lookup: a miss of an evicted entry gives its bytes back...
    c = loader.stats().last.cache
    assert 0 < c.hits < N and c.errors == 0
    # ...and the tier holds no more than the server kept (its ceiling): nothing refilled
    assert be.usage()["decoded"] == be.scan_bytes() == left
    loader.close()


def _jobs(url: str, n: int, budget: int = 64 << 20, **kw) -> list[RedisBackend]:
    """``n`` jobs' backends on the server at ``url``, as a loader opens them (the ledger on
    under an evicting policy), each with one tier, decoded, of ``budget`` bytes."""
    limits = read_limits(url)
    assert limits.evicts
    jobs = [RedisBackend(url, budget, allow_oom=limits.allow_oom, ledger=True, **kw)
            for _ in range(n)]
    for be in jobs:
        be.set_budgets({"decoded": budget})
    return jobs


def _key(i: int, ns: bytes = b"N" * 16) -> bytes:
    return sample_key(ns, i)


CEILING = b"hr:used:ceiling:decoded"


def test_a_lookup_between_a_reservation_and_its_set_blocks_no_insert(limited,
                                                                    redis_server) -> None:
    # under volatile-lru a lookup that fell between job A's reservation and its SET counted the
    # entry evicted and set the tier's ceiling at its count: 64 MB of budget, 100 KB counted,
    # and no job could insert for 60 s (a review)
    _cap(limited, 64 << 20, "volatile-lru")
    a, b = _jobs(redis_server.url, 2)
    for i in range(10):
        assert a.put(_key(i), "decoded", os.urandom(10_000), []) == "stored"
    blob = os.urandom(10_000)
    res, cost, at = a.reserve(_key(10), "decoded", len(blob))  # A's SET not sent yet...
    assert res == "stored"
    assert b.get(_key(10), bytes) is None  # ...when B looks the sample up: a miss
    assert not limited.exists(CEILING)
    assert b.put(_key(11), "decoded", os.urandom(10_000), []) == "stored"
    assert a.store(_key(10), "decoded", blob, cost, at) == "stored"
    assert a.usage()["decoded"] == a.scan_bytes()  # all 12 counted, once
    a.close_here()
    b.close_here()


def test_a_reservation_whose_set_finds_another_writers_entry_is_given_back_once(
        limited, redis_server) -> None:
    # A's SET NX found C's entry and refunded A's bytes, which B's lookup had already given
    # back (with C's): the count ran low by both (a review)
    _cap(limited, 64 << 20, "volatile-lru")
    a, b, c = _jobs(redis_server.url, 3)
    assert a.put(_key(0), "decoded", os.urandom(10_000), []) == "stored"
    blob = os.urandom(10_000)
    ra, ca, at_a = a.reserve(_key(1), "decoded", len(blob))
    rc, cc, at_c = c.reserve(_key(1), "decoded", len(blob))
    assert ra == rc == "stored"
    assert b.get(_key(1), bytes) is None
    assert c.store(_key(1), "decoded", blob, cc, at_c) == "stored"
    assert a.store(_key(1), "decoded", blob, ca, at_a) == "exists"
    assert a.usage()["decoded"] == a.scan_bytes()
    for be in (a, b, c):
        be.close_here()


def test_an_entry_expired_by_its_ttl_blocks_no_insert(limited, redis_server) -> None:
    # an entry not hit for its TTL and then looked up set the ceiling as if Redis had evicted
    # it: the tier held at most what was left, here nothing (a review)
    _cap(limited, 64 << 20, "volatile-lru")
    (short,) = _jobs(redis_server.url, 1, ttl_s=0.05)
    (other,) = _jobs(redis_server.url, 1)
    assert short.put(_key(0), "decoded", os.urandom(10_000), []) == "stored"
    deadline = time.monotonic() + 10.0
    while limited.exists(b"hr:" + _key(0)):  # the server's clock passes the 50 ms TTL
        assert time.monotonic() < deadline, "the entry did not expire"
    assert other.get(_key(0), bytes) is None
    assert not limited.exists(CEILING)
    assert other.put(_key(1, b"M" * 16), "decoded", os.urandom(10_000), []) == "stored"
    assert other.usage()["decoded"] == other.scan_bytes()  # the expired entry's bytes back
    short.close_here()
    other.close_here()


def test_a_recount_sums_every_namespace(limited, redis_server) -> None:
    # a recount summed only the first 256 namespaces: with more (many jobs, an augmented form's
    # namespace per epoch) the count came out low and inserts passed the budget (a review)
    _cap(limited, 64 << 20, "allkeys-lru")
    n, size = 300, 1000
    cost = entry_cost(len(b"hr:" + _key(0)), size) + LEDGER_META
    (be,) = _jobs(redis_server.url, 1, budget=n * cost + cost // 2)
    for i in range(n):  # one entry in each of 300 namespaces: the budget less half an entry
        assert be.put(_key(0, b"%016d" % i), "decoded", os.urandom(size), []) == "stored"
    assert be.put(_key(1), "decoded", os.urandom(size), []) == "full"  # not lowered to 256's
    limited.delete(b"hr:used")  # as allkeys-lru may evict it: the next insert recounts it
    assert be.put(_key(2), "decoded", os.urandom(size), []) == "full"
    assert be.usage()["decoded"] == be.scan_bytes() == n * cost
    be.close_here()


def test_a_unix_socket_url(tmp_path, no_leaks) -> None:
    import shutil

    from tests.redis_server import RedisServer

    # `make test` installs redis-server: missing, this fails rather than skipping
    assert shutil.which("redis-server"), "redis-server is not installed (apt-get install redis-server)"
    sock = tmp_path / "redis.sock"
    server = RedisServer("--unixsocket", str(sock), "--unixsocketperm", "700")
    server.start()
    try:
        cache = hr.Cache(url=f"unix://{sock}?db=0", budget_bytes=1 << 20, split={"decoded": 1.0})
        loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=2,
                               options=hr.Options(seed=5, cache=cache))
        first, second = samples(loader), samples(loader)
        assert first.keys() == second.keys() == set(range(N))
        e0, e1 = (e.cache for e in loader.stats().epochs)
        assert e0.inserts == N and (e1.hits, e1.errors) == (N, 0)
        assert loader.cache.limits.error is None  # read over the socket too
        loader.close()
    finally:
        server.stop()
