"""B_cache, Seneca's cache bandwidth (MDP, §5.1): bytes per second this process reads from
its cache, measured on the backend the cache really uses.

* memory (``"memory"``): entries are read in place from shared memory, then copied once into
  the step's value, so a timed copy of ``MEMORY_PROBE_BYTES`` is the bandwidth;
* Redis: every value crosses the network (or a socket) from the server, so a copy in memory
  says nothing of it (planned with a 10 GB/s copy where a 1 GbE server gives 117 MB/s, MDP put
  the whole budget on the decoded form: 332 samples/s on that server, where the encoded form it
  picks with 117 MB/s gives 400). One value of a sample's size is written under
  ``PROBE_PREFIX`` with a short expiry, read back in ``PROBE_ROUNDS`` rounds, then deleted.
  Seneca's B_cache is the *maximum* bandwidth a training node achieves, and the loader's
  workers read concurrently: one ``GET`` at a time measures a small value's round trip instead
  (4 KiB read 39 MB/s on loopback, 600 KB 1.8 GB/s). Each round is a pipeline of
  :func:`reads_per_round` ``GET``s (about ``PROBE_ROUND_BYTES`` in all), whose round trip is
  paid once, as concurrent readers overlap theirs.

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
"""Rounds of pipelined ``GET``s timed on a Redis server (after one untimed ``GET``, which may
connect)."""
PROBE_ROUND_BYTES = 1 << 20
"""Bytes a round reads, about: small values are read that many times over in one pipeline."""
MAX_READS_PER_ROUND = 64
"""``GET``s a round pipelines at most."""
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


def reads_per_round(nbytes: int) -> int:
    """``GET``s of an ``nbytes`` value one timed round pipelines: ``PROBE_ROUND_BYTES`` of
    them, at least 1 and at most ``MAX_READS_PER_ROUND``."""
    return max(1, min(MAX_READS_PER_ROUND, PROBE_ROUND_BYTES // max(1, nbytes)))


def from_round_trips(nbytes: int, seconds: Sequence[float]) -> float:
    """Bytes/s of rounds that read ``nbytes`` each and took ``seconds`` each: the median's (one
    slow round, a scheduling hiccup, does not set it)."""
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
    ``PROBE_ROUNDS`` timed rounds of :func:`reads_per_round` pipelined ones, then ``DEL``. Raises what the server raised (unreachable,
    refused for memory); the value is deleted whatever happens after it was set."""
    r = backend._r()
    key = PROBE_PREFIX + uuid.uuid4().hex[:16].encode()
    value = b"\x5a" * nbytes
    backend._call(lambda: r.set(key, value, px=PROBE_TTL_MS))
    try:
        got = backend._call(lambda: r.get(key))
        if got is None or len(got) != nbytes:
            raise RuntimeError("the bandwidth probe's value was not read back (evicted?)")
        reads = reads_per_round(nbytes)
        seconds = []
        for _ in range(PROBE_ROUNDS):
            pipe = r.pipeline(transaction=False)
            for _ in range(reads):
                pipe.get(key)
            t0 = time.perf_counter()
            backend._call(pipe.execute)
            seconds.append(time.perf_counter() - t0)
    finally:
        try:
            r.delete(key)
        except Exception:  # noqa: BLE001 - it expires after PROBE_TTL_MS anyway
            pass
    return from_round_trips(nbytes * reads, seconds)
