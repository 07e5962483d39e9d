"""The Redis cache against a server's own settings: other URL schemes."""

from __future__ import annotations

import pytest

import headrace as hr
from tests.integration.test_cache import N, pipeline, samples

pytestmark = [pytest.mark.integration, pytest.mark.redis]


def test_a_unix_socket_url(tmp_path, no_leaks) -> None:
    import shutil

    from tests.redis_server import RedisServer

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
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
        loader.close()
    finally:
        server.stop()
