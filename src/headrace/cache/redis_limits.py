"""What a Redis server can hold, read once when a loader opens its cache.

headrace enforces its own budget (``redis_backend``), but the server has its own limit: past
``maxmemory`` Redis either refuses writes (``noeviction``, its default: every command of a
``MULTI`` too) or evicts keys (``volatile-lru``, ElastiCache's default; ``allkeys-lru`` ...),
the cache's entries and, under ``allkeys-*``, its counts. So at open:

* ``maxmemory`` and the policy come from ``CONFIG GET``; a managed server that refuses it (a
  renamed or ACL-denied command) answers ``INFO memory``, which has both; where neither
  answers, the budget stays as configured and the policy counts as evicting;
* the budget is capped at ``SERVER_SHARE`` of what the server has left for headrace:
  ``maxmemory`` minus what it holds beside headrace's counted entries (``used_memory`` minus
  ``hr:used``), so the counted bytes, Redis's allocator rounding and its own structures fit;
  ``Cache(budget_bytes=None)`` takes exactly that (the local default only for a server without
  ``maxmemory``), a larger configured budget is lowered with a warning;
* an evicting policy turns the ledger on (``redis_scripts``: a lookup that finds a counted
  entry gone gives its bytes back), with a warning once per server and process;
* whether scripts may declare flags (Redis >= 7: ``allow-oom`` lets the bookkeeping run past
  ``maxmemory``) is tried with a one-line script.

``redis_backend.read_limits`` reads them (the only module importing ``redis``); this one decides.

``explain()`` prints all of it. Nothing is re-read later: a server reconfigured under a running
loader is seen by the next loader.
"""

from __future__ import annotations

import dataclasses
import logging

from headrace.cache.config import redact

log = logging.getLogger("headrace")

SERVER_SHARE = 0.7
"""A Redis cache's budget is at most this share of the memory the server has left for it:
headrace's count underestimates what Redis allocates (16.7 KB entries took 21.6 KB each on
this machine, 1.3x, the allocator rounding to 20 KB), and each connection takes ~20 KB."""
NO_EVICTION = "noeviction"


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """A Redis server's memory limits as read at open (``redis_backend.read_limits``)."""

    maxmemory: int | None
    """Bytes; 0: none set (the server grows until its machine runs out); None: not read."""
    policy: str | None
    """``maxmemory-policy`` (``"noeviction"``, ``"volatile-lru"`` ...); None: not read."""
    used: int | None
    """``used_memory``: bytes the server held at open, headrace's entries included."""
    counted: int
    """Bytes headrace's counts held at open (``hr:used``, every tier and job)."""
    allow_oom: bool
    """Scripts may declare flags (Redis >= 7): the bookkeeping runs past ``maxmemory``."""
    source: str = ""
    """Where ``maxmemory`` was read: ``"CONFIG GET"`` or ``"INFO memory"``."""
    error: str | None = None
    """Why nothing could be read (the server unreachable at open), else None."""

    @property
    def evicts(self) -> bool:
        """Redis may remove entries the cache counts: a policy other than ``noeviction`` under
        a ``maxmemory``, or one that could not be read."""
        return self.maxmemory != 0 and self.policy != NO_EVICTION

    def room(self) -> int | None:
        """The most bytes a budget may take (``SERVER_SHARE`` of ``maxmemory`` minus what the
        server holds beside headrace's entries); None: no limit known."""
        if not self.maxmemory:
            return None
        other = max(0, (self.used or 0) - self.counted)
        return max(0, int((self.maxmemory - other) * SERVER_SHARE))


def open_budget(url: str, configured: int | None) -> tuple[int | None, ServerLimits, str]:
    """``fit`` on the limits the server at ``url`` has now: the budget, the limits, why."""
    from headrace.cache.redis_backend import read_limits

    limits = read_limits(url)
    budget, why = fit(url, configured, limits)
    return budget, limits, why


def fit(url: str, configured: int | None, limits: ServerLimits) -> tuple[int | None, str]:
    """The budget (bytes) for ``configured`` (``Cache.budget_bytes``; None: the default) on a
    server with ``limits``, and why, in words ("" when unchanged; None: no server limit, so
    the local default). Warns once about a capped configured budget and an evicting policy."""
    from headrace import units

    if limits.evicts and limits.error is None:
        _warn_once(url, f"headrace: the Redis server at {redact(url)} may evict keys "
                   f"(maxmemory-policy {limits.policy or 'not readable'}): the cache's byte "
                   "count gives an entry's bytes back when a lookup finds it gone, so it follows "
                   "what the server holds within an epoch"
                   + (", but the counts themselves may be evicted (allkeys-*): the server's "
                      "maxmemory is then the only bound" if _all_keys(limits) else ""))
    room = limits.room()
    if room is None:
        return configured, ""
    assert limits.maxmemory is not None
    beside = max(0, (limits.used or 0) - limits.counted)
    why = (f"{100 * SERVER_SHARE:.0f}% of what the server has left: maxmemory "
           f"{units.size(limits.maxmemory)} ({limits.source}) less {units.size(beside)} it "
           "holds beside headrace's entries")
    if configured is None:
        return room, why
    if configured > room:
        _warn_once(url, f"headrace: Cache(budget_bytes={configured}) is more than the Redis "
                   f"server at {redact(url)} has room for: the budget is {units.size(room)}, "
                   f"{why}")
        return room, f"Cache(budget_bytes) {units.size(configured)} capped at {why}"
    return configured, ""


def _all_keys(limits: ServerLimits) -> bool:
    return limits.policy is None or limits.policy.startswith("allkeys")


_warned: set[str] = set()
"""Warnings this process gave (once each)."""


def _warn_once(url: str, message: str) -> None:
    key = f"{redact(url)}|{message}"
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def explain_lines(limits: ServerLimits, why: str) -> list[str]:
    """``explain()``'s lines on the server's limits and what they did to the budget."""
    from headrace import units

    if limits.error is not None:
        return [f"  server: its limits could not be read at open ({limits.error}): the budget "
                "is as configured"]
    mm = ("not readable (CONFIG GET and INFO refused)" if limits.maxmemory is None else
          "none (the server grows until its machine runs out)" if limits.maxmemory == 0 else
          f"{units.size(limits.maxmemory)} ({limits.source})")
    out = [f"  server: maxmemory {mm}, policy {limits.policy or 'not readable'}"
           + (f", {units.size(limits.used)} in use at open" if limits.used is not None else "")]
    if why:
        out.append(f"  budget: {why}")
    if limits.evicts:
        out.append("  eviction: Redis may evict entries the cache counts; a lookup that finds a "
                   "counted entry gone gives its bytes back (a ledger of each stored entry's "
                   "bytes), and after one Redis evicted (gone before its TTL ran out) the tier "
                   "holds at most what the server held after its evictions (for a minute after "
                   "the last found)"
                   + ("; the counts themselves may be evicted too (allkeys-*)"
                      if _all_keys(limits) else ""))
    elif limits.maxmemory:
        out.append("  past maxmemory (noeviction) an insert is refused (counted as full) and "
                   "lookups still read"
                   + ("" if limits.allow_oom else "; before Redis 7 a refused insert's bytes "
                      "stay counted until their namespace expires"))
    return out
