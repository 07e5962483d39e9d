"""B_cache, Seneca's cache bandwidth (MDP, §5.1): bytes per second this process reads from
its cache, measured on the backend the cache really uses.

* memory (``"memory"``): entries are read in place from shared memory, then copied once into
  the step's value, so a timed copy of ``MEMORY_PROBE_BYTES`` is the bandwidth;
* Redis: every value crosses the network (or a socket) from the server, so a copy in memory
  says nothing of it (planned with a 10 GB/s copy where a 1 GbE server gives 117 MB/s, MDP put
  the whole budget on the decoded form: 332 samples/s on that server, where the encoded form it
  picks with 117 MB/s gives 400). One value of a sample's size is written under
  ``PROBE_PREFIX`` with a short expiry, read back ``PROBE_ROUNDS`` times, then deleted.

``Cache(b_cache=...)`` replaces the measurement (``cache/session.py``).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

MEMORY_PROBE_BYTES = 32 << 20
"""Bytes of the copy timed for the memory backend."""
PROBE_ROUNDS = 5
"""``GET`` round trips timed on a Redis server (after one untimed, which may connect)."""
PROBE_MIN_BYTES = 4 << 10
PROBE_MAX_BYTES = 8 << 20
"""Bounds of the probe value, bytes: a sample's size within them (at most 6 × 8 MiB cross the
network, about 0.4 s on 1 GbE, once per loader)."""
PROBE_PREFIX = b"hr:bandwidth-probe:"
"""Key prefix of the probe value (a random suffix per probe; never an entry's key length)."""
PROBE_TTL_MS = 60_000
"""The probe value expires after this even if its process dies before deleting it."""


def probe_size(nbytes: float) -> int:
    """The probe value's bytes for forms of at most ``nbytes`` bytes per sample: ``nbytes``
    within ``PROBE_MIN_BYTES`` and ``PROBE_MAX_BYTES``. The session passes the largest allowed
    form's size: the budget's bytes go to large values, whose reads are limited by bandwidth,
    while a small value's read is limited by its round trip, which concurrent workers overlap."""
    return int(min(PROBE_MAX_BYTES, max(PROBE_MIN_BYTES, nbytes)))


def from_round_trips(nbytes: int, seconds: Sequence[float]) -> float:
    """Bytes/s of reads of ``nbytes`` that took ``seconds`` each: the median's (one slow round
    trip, a scheduling hiccup, does not set it)."""
    if not seconds:
        raise ValueError("no round trip timed")
    return nbytes / max(1e-9, statistics.median(seconds))


def memory_bandwidth() -> float:
    """Bytes/s of one timed copy of ``MEMORY_PROBE_BYTES`` (the memory backend)."""
    import numpy as np

    src = np.ones(MEMORY_PROBE_BYTES, np.uint8)
    dst = np.empty_like(src)
    t0 = time.perf_counter()
    np.copyto(dst, src)
    return src.nbytes / max(1e-6, time.perf_counter() - t0)


def redis_bandwidth(backend: Any, nbytes: int) -> float:
    """Bytes/s of ``GET``s of an ``nbytes`` value on ``backend``'s server (a
    ``redis_backend.RedisBackend``): one ``SET`` with ``PROBE_TTL_MS``, one untimed ``GET``,
    ``PROBE_ROUNDS`` timed ones, then ``DEL``. Raises what the server raised (unreachable,
    refused for memory); the value is deleted whatever happens after it was set."""
    r = backend._r()
    key = PROBE_PREFIX + uuid.uuid4().hex[:16].encode()
    value = b"\x5a" * nbytes
    backend._call(lambda: r.set(key, value, px=PROBE_TTL_MS))
    try:
        got = backend._call(lambda: r.get(key))
        if got is None or len(got) != nbytes:
            raise RuntimeError("the bandwidth probe's value was not read back (evicted?)")
        seconds = []
        for _ in range(PROBE_ROUNDS):
            t0 = time.perf_counter()
            backend._call(lambda: r.get(key))
            seconds.append(time.perf_counter() - t0)
    finally:
        try:
            r.delete(key)
        except Exception:  # noqa: BLE001 - it expires after PROBE_TTL_MS anyway
            pass
    return from_round_trips(nbytes, seconds)
