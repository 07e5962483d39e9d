"""B_cache, Seneca's cache bandwidth (MDP, §5.1): bytes per second this process reads from
its cache, measured on the backend the cache really uses.

* memory (``"memory"``): entries are read in place from shared memory, then copied once into
  the step's value, so a timed copy of ``MEMORY_PROBE_BYTES`` is the bandwidth;
* Redis: every value crosses the network (or a socket) from the server, so a copy in memory
  says nothing of it (planned with a 10 GB/s copy where a 1 GbE server gives 117 MB/s, MDP put
  the whole budget on the decoded form: 332 samples/s on that server by MDP's own prediction,
  where the encoded form it picks with 117 MB/s gives 400; ``tests/unit/test_cache_bandwidth.py``
  computes both). One value of a sample's size is written under
  ``PROBE_PREFIX`` with a short expiry, read back in ``PROBE_ROUNDS`` rounds, then deleted.
  Seneca's B_cache is the *maximum* bandwidth a training node achieves, and the loader's
  workers read concurrently: one ``GET`` at a time measures a small value's round trip instead
  (4 KiB read 39 MB/s on loopback, 600 KB 1.8 GB/s). Each round is a pipeline of
  :func:`reads_per_round` ``GET``s (about ``PROBE_ROUND_BYTES`` in all), whose round trip is
  paid once, as concurrent readers overlap theirs.

  *The probe never makes Redis evict what it holds.* Under an evicting ``maxmemory-policy``
  (``allkeys-*``, and ``volatile-*``, as every entry has a TTL) the value written, and the
  replies a round leaves in the server's output buffer, made Redis evict cached entries when
  the server was near its ``maxmemory`` (a 256 KiB probe evicted 12 of 25 100 KB entries, a
  1 MiB one 21). So the server's ``INFO memory`` is read first: the value is written only when
  its peak footprint (:func:`probe_footprint`) fits in ``PROBE_ROOM_SHARE`` of the room left
  under ``maxmemory``; otherwise entries the server already holds are read instead (the
  largest of ``ENTRY_TRIES`` random headrace entries whose replies fit that room), so nothing
  is written. A round pipelines as many ``GET``s of that entry as move about the bytes a round
  of the probe value would (:func:`held_reads`, within the room), so its round trip is spread
  as for the form; where the room is unknown a round is one ``GET``, and the entry then needs
  ``ENTRY_MIN_SHARE`` of the probe's size (a round moving less measures round trips, not
  bandwidth). With no such entry the probe fails, and MDP plans at a later epoch. Under
  ``noeviction`` or without a ``maxmemory`` the value is written as before (a refused ``SET``
  evicts nothing).

``Cache(b_cache=...)`` replaces the measurement (``cache/session.py``).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

MEMORY_PROBE_BYTES = 32 << 20
"""Bytes of the copy timed for the memory backend."""
MEMORY_PROBE_COPIES = 3
"""Copies of ``MEMORY_PROBE_BYTES`` timed into one buffer; the fastest is the bandwidth."""
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
PROBE_ROOM_SHARE = 0.5
"""Under an evicting policy, the probe occupies at most this share of the bytes the server has
left under ``maxmemory`` (other writers, the jobs' workers, share the rest meanwhile)."""
ENTRY_TRIES = 32
"""``RANDOMKEY`` calls that look for a cached entry to read when no probe value fits."""
ENTRY_MIN_SHARE = 1 / 4
"""A round of ``GET``s of a cached entry, read instead of a probe value, moves at least this
share of the probe value's bytes. A round costs a fixed time (its round trip) plus its bytes
over the bandwidth; a round ``k`` times smaller than the value pays that fixed time ``k``
times as often per byte, so its B_cache is low by up to ``k``x where the fixed time dominates
(one ``GET`` of a 2 KB entry a round: 42 MB/s, where the same server read 1 MiB values at
477 MB/s). With ``k`` <= 4 it is low by at most (1 + 4f) / (1 + f), ``f`` the fixed time's
share of reading the value: within noise on loopback (measured in docs/design.md), where one
2 KiB entry a round read 27x too low. It bites where a round is one ``GET`` (the room is
unknown, or holds one reply): elsewhere :func:`held_reads` pipelines enough ``GET``s."""


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
    """Bytes/s of the fastest of ``MEMORY_PROBE_COPIES`` timed copies of
    ``MEMORY_PROBE_BYTES`` into one buffer (the memory backend): Seneca's B_cache is the most a
    node reads. One copy into a fresh buffer timed its page faults as well: on one machine the
    demo read 0.8 to 14.6 GB/s from run to run, and at 0.8 GB/s MDP predicted the decoded form
    1,045 samples/s against 1,408-1,431; a lower reading moves the budget to the encoded form
    (614-631 predicted), whose lookups in epoch 2 find nothing epoch 1 stored: the likely cause
    of ``make demo``'s epochs 2 with no hits (not caught with the reading in hand)."""
    import numpy as np

    src = np.ones(MEMORY_PROBE_BYTES, np.uint8)
    dst = np.empty_like(src)
    seconds = []
    for _ in range(MEMORY_PROBE_COPIES):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        seconds.append(time.perf_counter() - t0)
    return fastest(src.nbytes, seconds)


def fastest(nbytes: int, seconds: Sequence[float]) -> float:
    """Bytes/s of the fastest of copies of ``nbytes`` that took ``seconds`` each (the first
    into a fresh buffer also takes its page faults)."""
    if not seconds:
        raise ValueError("no copy timed")
    return nbytes / max(1e-6, min(seconds))


@dataclasses.dataclass(frozen=True)
class Probe:
    """A B_cache measured on a Redis server: ``bytes_per_s`` and ``how``, in words."""

    bytes_per_s: float
    how: str


def held_reads(size: int, room: int, nbytes: int) -> int:
    """``GET``s of a held ``size``-byte entry a round pipelines in place of a probe value of
    ``nbytes``: as many as move the bytes a round of that value would (``nbytes`` times
    :func:`reads_per_round`), at most ``MAX_READS_PER_ROUND`` and as many replies as ``room``
    bytes hold, at least 1; 1 where ``room`` is -1 (unknown)."""
    if room < 0:
        return 1
    wanted = nbytes * reads_per_round(nbytes)
    return max(1, min(MAX_READS_PER_ROUND, -(-wanted // max(1, size)), room // max(1, size)))


def stands_for(size: int, room: int, nbytes: int) -> bool:
    """Whether a round of :func:`held_reads` ``GET``s of a held ``size``-byte entry moves
    ``ENTRY_MIN_SHARE`` of a probe round of ``nbytes`` values (``nbytes`` times
    :func:`reads_per_round`) or more: compared with one value, a 100-byte entry stood for a
    4 KiB form's 256 KiB rounds at 1/41 (a review)."""
    return size * held_reads(size, room, nbytes) >= nbytes * reads_per_round(nbytes) * ENTRY_MIN_SHARE


def probe_footprint(nbytes: int) -> int:
    """Bytes a written probe of an ``nbytes`` value occupies in the server at its peak: the
    value twice (its query buffer while it arrives, then the key) and a round's replies."""
    return 2 * nbytes + nbytes * reads_per_round(nbytes)


def probe_room(info: dict[str, Any]) -> int | None:
    """Bytes the probe may occupy without Redis evicting keys for it, from ``INFO memory``
    (``info``; empty where the server refuses it): None where Redis evicts nothing (no
    ``maxmemory``, or ``noeviction``); else ``PROBE_ROOM_SHARE`` of ``maxmemory`` less
    ``used_memory``; -1 where the limit or the policy could not be read."""
    maxmemory, policy = info.get("maxmemory"), info.get("maxmemory_policy")
    if maxmemory == 0 or policy == "noeviction":
        return None
    if maxmemory is None or policy is None or "used_memory" not in info:
        return -1
    return max(0, int((int(maxmemory) - int(info["used_memory"])) * PROBE_ROOM_SHARE))


def redis_probe(backend: Any, nbytes: int) -> Probe:
    """B_cache on ``backend``'s server (a ``redis_backend.RedisBackend``) for values of
    ``nbytes``, never making the server evict a key (see the module's docstring): a probe value
    written (:func:`redis_bandwidth`) where it fits, else rounds of ``GET``s of an entry the
    server holds. Raises what the server raised, or ``RuntimeError`` when there is neither room
    nor an entry to read."""
    from headrace import units

    r = backend._r()
    try:
        info = dict(r.info("memory"))
    except Exception:  # noqa: BLE001 - refused (managed Redis): room unknown, nothing written
        info = {}
    room = probe_room(info)
    if room is None or probe_footprint(nbytes) <= room:
        return Probe(redis_bandwidth(backend, nbytes),
                     f"{PROBE_ROUNDS} rounds of {reads_per_round(nbytes)} pipelined GETs of a "
                     f"{units.size(nbytes)} value from the server")
    least = int(nbytes * reads_per_round(nbytes) * ENTRY_MIN_SHARE)  # of a probe round
    key, size = _held_entry(backend, room, nbytes)
    if key is None:
        raise RuntimeError(
            f"no room to write a {units.size(nbytes)} probe value without the server evicting "
            f"cached entries ({'unknown' if room < 0 else units.size(room)} of room under "
            f"maxmemory-policy {info.get('maxmemory_policy', 'not readable')}) and no cached "
            f"entry of which a round of GETs reads {units.size(least)} or more (one GET a "
            "round where the room is unknown); Cache(b_cache=...) sets B_cache")
    reads = held_reads(size, room, nbytes)
    return Probe(from_round_trips(size * reads, _timed_rounds(backend, key, size, reads)),
                 f"{PROBE_ROUNDS} rounds of {reads} pipelined GETs of a cached "
                 f"{units.size(size)} entry (no room to write a probe value without the server "
                 "evicting entries)")


def _held_entry(backend: Any, room: int, nbytes: int) -> tuple[bytes | None, int]:
    """The largest of ``ENTRY_TRIES`` random headrace entries whose value fits ``room``
    (any size where ``room`` is -1, unknown) and of which a round of :func:`held_reads`
    ``GET``s reads ``ENTRY_MIN_SHARE`` of a probe round or more (:func:`stands_for`), and its
    bytes; ``(None, 0)`` if none."""
    from headrace.cache.redis_backend import ENTRY_KEY_LENS, PREFIX

    r = backend._r()
    best: tuple[bytes | None, int] = (None, 0)
    for _ in range(ENTRY_TRIES):
        key = backend._call(r.randomkey)
        if key is None:
            break
        if not key.startswith(PREFIX) or len(key) not in ENTRY_KEY_LENS:
            continue
        size = int(backend._call(lambda k=key: r.strlen(k)))
        if size > best[1] and (room < 0 or size <= room) and stands_for(size, room, nbytes):
            best = (key, size)
    return best


def _timed_rounds(backend: Any, key: bytes, size: int, reads: int) -> list[float]:
    """Seconds of each of ``PROBE_ROUNDS`` rounds of ``reads`` pipelined ``GET``s of ``key``
    (a ``size``-byte value), after one untimed ``GET`` (which may connect)."""
    r = backend._r()
    got = backend._call(lambda: r.get(key))
    if got is None or len(got) != size:
        raise RuntimeError("the bandwidth probe's value was not read back (evicted?)")
    seconds = []
    for _ in range(PROBE_ROUNDS):
        pipe = r.pipeline(transaction=False)
        for _ in range(reads):
            pipe.get(key)
        t0 = time.perf_counter()
        backend._call(pipe.execute)
        seconds.append(time.perf_counter() - t0)
    return seconds


def redis_bandwidth(backend: Any, nbytes: int) -> float:
    """Bytes/s of ``GET``s of an ``nbytes`` value on ``backend``'s server (a
    ``redis_backend.RedisBackend``): one ``SET`` with ``PROBE_TTL_MS``, one untimed ``GET``,
    ``PROBE_ROUNDS`` timed rounds of :func:`reads_per_round` pipelined ones, then ``DEL``.
    Raises what the server raised (unreachable, refused for memory); the value is deleted
    whatever happens after it was set. Writes whether or not the server has room for it:
    :func:`redis_probe` decides that."""
    r = backend._r()
    key = PROBE_PREFIX + uuid.uuid4().hex[:16].encode()
    value = b"\x5a" * nbytes
    backend._call(lambda: r.set(key, value, px=PROBE_TTL_MS))
    reads = reads_per_round(nbytes)
    try:
        seconds = _timed_rounds(backend, key, nbytes, reads)
    finally:
        try:
            r.delete(key)
        except Exception:  # noqa: BLE001 - it expires after PROBE_TTL_MS anyway
            pass
    return from_round_trips(nbytes * reads, seconds)
