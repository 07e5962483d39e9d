"""ODS's shared state in Redis: per-sample status and reference count, jobs, seen bits.

Jobs that share a Redis cache and run the same pipeline prefix (one *group*: the hash of their
tiers' fingerprints) share, under ``hr:ods:<group>:``:

* ``st``: a hash, sample index -> ``refs * 8 + tiers`` (Seneca's status byte and reference
  count): ``tiers`` is a bit mask of the forms held (1 encoded, 2 decoded, 4 augmented),
  ``refs`` the jobs that used the entry (the job that stored it counts as one);
* ``jobs``: a sorted set, member -> the time (ms, the server's clock) its registration
  expires; every request of a live job pushes its own forward by ``ttl``, and each script
  drops the expired ones, so a job killed with SIGKILL stops counting after ``ttl``. A member
  is ``<job>#<token>``: the job's name (``Cache.job``) and a token drawn by each loader, so two
  live loaders given one name (a script launched twice) count as two jobs and keep their own
  seen bits (the second is warned); a restart under its old name registers anew, and the dead
  process's member expires after ``ttl`` like any killed job's;
* ``seen:<member>:<epoch>``: the member's seen bits for that epoch (``SETBIT``), expiring
  ``ttl`` after its last request. The job's own process keeps the authoritative copy
  (``ods.Substitution``, saved in its state dict); this one lets the server filter the
  candidates it returns.

Everything is changed by Lua scripts, so a read-modify-write is atomic across workers and jobs:
``ASK`` (the scheduler, once per sampler batch): register, mark what was chosen since the last
request seen, answer which requested samples are cached and draw unseen cached ones at random
(``HRANDFIELD``), both only in a tier the job looks up this epoch (its mask of ``TIER_BIT``:
jobs of one group may cache other forms, a user's ``split`` or MDP's, and an entry of a form
the job does not read would be a miss). In ``redis_scripts``: ``ODS_USE`` (after a worker's
``GET``, in its ``MULTI``) counts a use; the entry is evicted when its uses reach the live jobs
(Seneca's threshold), its bytes returned to the budget; ``RESERVE`` (a worker's insert, before its
``SET``) sets the status.
No module here imports ``redis``: scripts run on the backend's client.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from headrace.cache.ods import NO_ANSWER, Answer

log = logging.getLogger("headrace")

TIER_BIT = {"encoded": 1, "decoded": 2, "augmented": 4}
META = 32
"""Bytes counted per ODS entry, beside the entry itself, for its field in the status hash."""
CANDIDATE_DRAWS = 4
"""``ASK`` draws this many random cached samples per substitute wanted (then filters seen ones)."""
MAX_DRAW = 512
"""At most this many random fields drawn by one ``ASK``."""

_NOW = ("local t = redis.call('TIME') "
        "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) ")

ASK = _NOW + """
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
local mask = tonumber(ARGV[4])
local function usable(s)  -- a status (false: none) holding a form in the job's mask
  return s ~= false and bit.band(tonumber(s) % 8, mask) ~= 0
end
local nm = tonumber(ARGV[5])
for k = 6, 5 + nm do redis.call('SETBIT', KEYS[3], tonumber(ARGV[k]), 1) end
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('PEXPIRE', KEYS[3], ttl) end
local hits, req = {}, {}
for k = 6 + nm, #ARGV do
  req[ARGV[k]] = true
  hits[#hits + 1] = usable(redis.call('HGET', KEYS[1], ARGV[k])) and 1 or 0
end
local want = tonumber(ARGV[3])
local cands = {}
if want > 0 and mask > 0 then
  local drawn = redis.call('HRANDFIELD', KEYS[1], math.min(want * DRAWS, MOST), 'WITHVALUES')
  for j = 1, #drawn, 2 do
    if #cands >= want then break end
    local f = drawn[j]
    if usable(drawn[j + 1]) and not req[f]
        and redis.call('GETBIT', KEYS[3], tonumber(f)) == 0 then
      cands[#cands + 1] = tonumber(f)
    end
  end
end
return {hits, cands, redis.call('ZCARD', KEYS[2])}
""".replace("DRAWS", str(CANDIDATE_DRAWS)).replace("MOST", str(MAX_DRAW))


def tier_mask(tiers: Iterable[str]) -> int:
    """The ``TIER_BIT`` mask of ``tiers`` (names), as ``ASK`` filters the status with it."""
    return sum(TIER_BIT[t] for t in set(tiers))


def group_of(prefixes: Sequence[str]) -> str:
    """The ODS group of a pipeline: jobs whose tracked forms have these prefix fingerprints."""
    return hashlib.blake2b("|".join(sorted(prefixes)).encode(), digest_size=8).hexdigest()


class OdsKeys:
    """Key names of one group (``prefix``: the backend's key prefix, ``b"hr:"``)."""

    def __init__(self, prefix: bytes, group: str) -> None:
        self.group = group
        self.base = prefix + b"ods:" + group.encode() + b":"
        self.status = self.base + b"st"
        self.jobs = self.base + b"jobs"

    def seen(self, member: str, epoch: int) -> bytes:
        """The seen bits of ``member`` (``OdsBoard.member``: job name and token) in ``epoch``."""
        return self.base + f"seen:{member}:{epoch}".encode()


def _redis_bits(lsb_first: bytes) -> bytes:
    """``runtime.bitmap.Bitmap``'s bytes (bit i at ``1 << i % 8``) in Redis's bit order
    (``SETBIT`` offset i is bit ``7 - i % 8`` of byte ``i // 8``)."""
    return lsb_first.translate(_REVERSE)


_REVERSE = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


class OdsBoard:
    """One job's view of its group's shared state (training process; scheduler thread).

    ``backend``: a ``RedisBackend`` (its client runs the scripts); ``job``: the job's name
    (``Cache.job``); ``ttl_s``: how long the job's registration and seen bits outlive its last
    request (seconds).
    """

    def __init__(self, backend: Any, keys: OdsKeys, job: str, ttl_s: float) -> None:
        self.backend = backend
        self.keys = keys
        self.job = job
        self.member = f"{job}#{uuid.uuid4().hex[:8]}"
        """This loader's registration among the group's live jobs and the name of its seen
        bits: the job's name and a token of this board, so that another live loader given the
        same name neither hides this one's candidates nor counts as the same job."""
        self._checked = False  # whether the name was checked against the live members
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.errors = 0
        """Requests that failed (the server down): their positions were filled without ODS."""
        self.jobs = 1
        """Live jobs at the last answer."""

    def _script(self, name: str) -> Any:
        self.backend._r()
        return self.backend.scripts[name]

    def start_epoch(self, epoch: int, seen_bits: bytes) -> None:
        """Write the job's seen bits for ``epoch`` (the delivered set of a resumed epoch, else
        empty) and register the job."""
        try:
            r = self.backend._r()
            key = self.keys.seen(self.member, epoch)
            bits = _redis_bits(seen_bits)
            if bits.strip(b"\x00"):
                r.set(key, bits, px=self.ttl_ms)
            else:
                r.delete(key)
        except Exception:  # noqa: BLE001 - the server down: ODS answers misses meanwhile
            self.errors += 1
        if self.ask(epoch, (), 0, ()) is not NO_ANSWER and not self._checked:
            self._checked = True
            self._warn_if_named_twice()

    def _warn_if_named_twice(self) -> None:
        """Warn when another live member of the group has this job's name (registered, once,
        right after this board's first registration dropped the expired ones)."""
        try:
            members = self.backend._r().zrange(self.keys.jobs, 0, -1)
        except Exception:  # noqa: BLE001 - only a warning is lost
            return
        others = [m for m in (x.decode() for x in members)
                  if m != self.member and m.rpartition("#")[0] == self.job]
        if others:
            log.warning(
                "headrace: ODS job name %r is registered by another loader on this Redis cache "
                "(a second live job given the same Cache(job=...), or this job's previous run "
                "if it stopped less than ods_ttl_s=%g s ago): each keeps its own ODS state and "
                "counts as a live job; give concurrent jobs distinct names",
                self.job, self.ttl_ms / 1000)

    def ask(self, epoch: int, requested: Sequence[int], want: int, marks: Sequence[int]) -> Answer:
        """Which of ``requested`` are cached, and up to ``want`` unseen cached samples; marks
        ``marks`` seen first. Cached means in a tier this job looks up: the backend's
        ``ods_tiers``, which the session's plan sets each epoch (its tracked forms with a
        budget). ``NO_ANSWER`` when the server fails."""
        k = self.keys
        mask = tier_mask(self.backend.ods_tiers)
        try:
            script = self._script("ods_ask")
            hits, cands, jobs = self.backend._call(lambda: script(
                keys=[k.status, k.jobs, k.seen(self.member, epoch)],
                args=[self.member, self.ttl_ms, want, mask, len(marks), *marks, *requested]))
        except Exception:  # noqa: BLE001 - counted; the positions are filled as misses
            self.errors += 1
            return NO_ANSWER
        self.jobs = int(jobs)
        return Answer([bool(h) for h in hits], [int(c) for c in cands], self.jobs)

    def leave(self) -> None:
        """Unregister (a job that closes; a killed one expires after ``ttl``)."""
        try:
            self.backend._r().zrem(self.keys.jobs, self.member)
        except Exception:  # noqa: BLE001 - it expires anyway
            pass
