"""B_cache measured on the backend a loader uses: GETs on the real Redis server, the option."""

from __future__ import annotations

import time

import numpy as np
import pytest

import headrace as hr
from headrace.cache.bandwidth import (
    PROBE_PREFIX,
    PROBE_ROUNDS,
    reads_per_round,
    redis_bandwidth,
    redis_probe,
)
from headrace.cache.redis_backend import PREFIX, RedisBackend
from headrace.cache.tiers import sample_key
from tests.integration.test_cache import pipeline, samples
from tests.integration.test_cache_redis_limits import _cap

pytestmark = [pytest.mark.integration, pytest.mark.redis]


@pytest.fixture
def server(redis_server):
    redis_server.flush()
    return redis_server


def _stats(r) -> tuple[int, int]:
    """GET calls the server served and bytes it sent, since it started."""
    gets = r.info("commandstats").get("cmdstat_get", {}).get("calls", 0)
    return gets, r.info("stats")["total_net_output_bytes"]


def test_the_probe_reads_a_samples_size_from_the_server_and_deletes_it(server) -> None:
    import redis

    r = redis.Redis.from_url(server.url)
    backend = RedisBackend(server.url, 1 << 20)
    gets0, out0 = _stats(r)
    b = redis_bandwidth(backend, 256 << 10)
    gets1, out1 = _stats(r)
    backend.close_here()
    assert b > 0
    reads = 1 + PROBE_ROUNDS * reads_per_round(256 << 10)  # one untimed, then timed rounds
    assert reads_per_round(256 << 10) == 4  # 1 MiB a round: round trips paid once a round
    assert gets1 - gets0 == reads
    assert out1 - out0 >= reads * (256 << 10)  # the value crossed the socket
    assert list(r.scan_iter(match=PROBE_PREFIX + b"*")) == []


def test_mdp_plans_a_redis_cache_with_the_servers_bandwidth(server, no_leaks) -> None:
    """The plan's B_cache is measured on the server: a probe value is written there, read,
    and deleted (keyspace notifications from the real server), not a copy in memory."""
    import redis

    r = redis.Redis.from_url(server.url)
    old = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
    r.config_set("notify-keyspace-events", "Kg$")  # generic (del) and string (set) events
    ps = r.pubsub()
    ps.psubscribe(b"__keyspace@0__:" + PROBE_PREFIX + b"*")
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=0,
                           options=hr.Options(seed=2, cache=hr.Cache(url=server.url,
                                                                     budget_bytes=1 << 20)))
    try:
        for _ in range(2):  # the second epoch is planned by MDP from the first's profile
            samples(loader)
        events = []
        while (m := ps.get_message(timeout=1.0)) is not None:
            if m["type"] == "pmessage":
                events.append(m["data"])
        assert events[:1] == [b"set"] and events[-1:] == [b"del"]  # (an "expire" between)
        s = loader.cache
        assert s.plan is not None and s.plan_b_cache == s.cache_bandwidth()
        assert list(r.scan_iter(match=PROBE_PREFIX + b"*")) == []
        assert "5 rounds of 64 pipelined GETs of a 4.1 KB value from the server" in \
            loader.explain()
    finally:
        loader.close()
        ps.close()
        r.config_set("notify-keyspace-events", old)


def test_b_cache_given_is_the_plans(no_leaks) -> None:
    cache = hr.Cache(budget_bytes=1 << 20, b_cache=117e6)
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=0,
                           options=hr.Options(seed=2, cache=cache))
    try:
        for _ in range(2):
            samples(loader)
        assert loader.cache.plan is not None and loader.cache.plan_b_cache == 117e6
        assert "cache bandwidth B_cache 117.0 MB/s, Cache.b_cache" in loader.explain()
    finally:
        loader.close()
    with pytest.raises(ValueError, match="b_cache"):
        hr.Cache(b_cache=0)


class _Wide:
    """A source whose decoded form is 64 KiB a sample (above the probe's 4 KiB floor)."""

    def __len__(self) -> int:
        return 16

    def load(self, i: int) -> bytes:
        return bytes([i]) * 64


def _widen(b: bytes) -> np.ndarray:
    time.sleep(0.004)  # simulated decode: the form is worth caching
    return np.full(16384, b[0], np.float32)


def test_the_cache_bench_measures_b_cache_at_the_samples_size(server, no_leaks) -> None:
    # the bench's prediction took session.cache_bandwidth() without a size: a Redis probe of
    # 4 KiB values (round trips), not of the 64 KiB samples the run caches
    from headrace import units
    from headrace.bench.cache import mdp_params
    from headrace.cache.bandwidth import PROBE_MIN_BYTES, probe_size

    cache = hr.Cache(url=server.url, budget_bytes=4 << 20, split={"decoded": 1.0})
    loader = hr.DataLoader(hr.Pipeline(_Wide(), [hr.step(_widen, kind="decode")]),
                           batch_size=4, num_workers=0, options=hr.Options(seed=2, cache=cache))
    try:
        assert sum(len(b) for b in loader) == 16
        params = mdp_params(loader.cache, loader.planning.profile(), 16, 1)
        n = probe_size(params.size_decoded)
        assert n > PROBE_MIN_BYTES
        assert f"pipelined GETs of a {units.size(n)} value" in loader.cache.b_cache_how
        assert params.b_cache == loader.cache.cache_bandwidth()
    finally:
        loader.close()


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_the_probe_never_makes_the_server_evict_cached_entries(server, policy) -> None:
    # the probe wrote a value the size of a sample: on a server near its maxmemory under an
    # evicting policy, Redis made room for it by evicting cached entries (any key under
    # allkeys-*, those with a TTL, as every entry has, under volatile-*)
    import redis

    r = redis.Redis.from_url(server.url)
    backend = RedisBackend(server.url, 1 << 20)
    ns = b"p" * 16
    _cap(r, 3 << 20, policy)
    try:
        for i in range(20):  # 2 MB of entries under a 3 MB room: no room for a 256 KiB probe
            r.set(PREFIX + sample_key(ns, i), bytes([i]) * 100_000, px=600_000)
        before = r.info("stats")["evicted_keys"]
        probe = redis_probe(backend, 256 << 10)  # measured reading entries the server holds
        assert probe.bytes_per_s > 0
        assert "GETs of a cached 100.0 KB entry" in probe.how
        assert r.info("stats")["evicted_keys"] == before
        assert all(r.exists(PREFIX + sample_key(ns, i)) for i in range(20))
        assert list(r.scan_iter(match=PROBE_PREFIX + b"*")) == []
        r.flushdb()  # no entry to read: the probe fails and writes nothing
        r.set(b"other", b"x" * 100_000)  # another application's key
        with pytest.raises(RuntimeError, match="no room to write"):
            redis_probe(backend, 2 << 20)
        assert r.exists(b"other") and r.info("stats")["evicted_keys"] == before
    finally:
        backend.close_here()
        r.config_set("maxmemory", 0)
        r.config_set("maxmemory-policy", "noeviction")
        server.flush()


def test_the_probe_reads_no_cached_entry_much_smaller_than_the_form(server) -> None:
    # near maxmemory the probe read whatever entry it found: a 2 KB one, where B_cache was
    # wanted for 1 MiB forms, measured round trips (42 MB/s where the server read 1 MiB
    # values at 477 MB/s), and MDP split the budget with that. Now such a probe fails (MDP
    # plans at a later epoch), and an entry of a quarter of the size or more is read.
    import redis

    from headrace.cache.bandwidth import ENTRY_MIN_SHARE

    r = redis.Redis.from_url(server.url)
    backend = RedisBackend(server.url, 1 << 20)
    ns = b"q" * 16
    _cap(r, 3 << 20, "allkeys-lru")
    try:
        for i in range(20):  # cached 2 KB entries (an encoded form, say)
            r.set(PREFIX + sample_key(ns, i), bytes([i]) * 2048, px=600_000)
        with pytest.raises(RuntimeError, match="no cached entry of which a round of GETs reads "
                           "262.1 KB or more"):  # 64 GETs a round at most: 131 KB
            redis_probe(backend, 1 << 20)
        assert list(r.scan_iter(match=PROBE_PREFIX + b"*")) == []
        # the probe samples 32 random keys: among 21, it missed the large one 1 run in 5
        r.delete(*(PREFIX + sample_key(ns, i) for i in range(20)))
        big = int((1 << 20) * ENTRY_MIN_SHARE)
        r.set(PREFIX + sample_key(ns, 20), b"z" * big, px=600_000)
        probe = redis_probe(backend, 1 << 20)
        assert probe.bytes_per_s > 0
        assert "GETs of a cached 262.1 KB entry" in probe.how
    finally:
        backend.close_here()
        r.config_set("maxmemory", 0)
        r.config_set("maxmemory-policy", "noeviction")
        server.flush()


def test_a_full_server_of_entries_smaller_than_a_quarter_of_the_form_is_measured(server):
    # 100 KB entries (encoded JPEGs, say) filled the server, where B_cache was wanted for
    # 480 KiB decoded forms: the probe needed an entry of a quarter of the form (120 KiB) and
    # failed at every epoch while the server stayed full, its steady state, so MDP never
    # planned. With the room known, a round pipelines GETs of the entry up to about the form's
    # bytes (the room allowing), so its round trip is spread as for the form.
    import re

    import redis

    from headrace.cache.bandwidth import ENTRY_MIN_SHARE

    r = redis.Redis.from_url(server.url)
    backend = RedisBackend(server.url, 1 << 20)
    ns = b"f" * 16
    form = 480 << 10
    _cap(r, 3 << 20, "allkeys-lru")
    try:
        for i in range(20):  # 2 MB of entries under a 3 MB room: no room for the probe value
            r.set(PREFIX + sample_key(ns, i), bytes([i]) * 100_000, px=600_000)
        assert form * ENTRY_MIN_SHARE > 100_000
        before = r.info("stats")["evicted_keys"]
        gets0, _ = _stats(r)
        probe = redis_probe(backend, form)
        gets1, _ = _stats(r)
        assert probe.bytes_per_s > 0
        m = re.search(r"(\d+) pipelined GETs of a cached 100.0 KB entry", probe.how)
        assert m is not None, probe.how
        reads = int(m.group(1))
        assert reads > 1 and reads * 100_000 >= form * ENTRY_MIN_SHARE
        assert gets1 - gets0 == 1 + PROBE_ROUNDS * reads  # one untimed GET, then the rounds
        assert r.info("stats")["evicted_keys"] == before  # replies within the room
        assert list(r.scan_iter(match=PROBE_PREFIX + b"*")) == []  # nothing written
    finally:
        backend.close_here()
        r.config_set("maxmemory", 0)
        r.config_set("maxmemory-policy", "noeviction")
        server.flush()
