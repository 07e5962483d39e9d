"""ODS's shared state in Redis: per-form status and reference count, jobs, seen bits.

Seneca keeps one status and reference count per sample and evicts at the number of jobs; its
jobs all cache the same forms. Here jobs sharing a server may cache other forms (one job's
``split`` puts its budget on the decoded form, another's on the augmented one; two pipelines
share a decoded prefix and differ after it), so the count and the threshold are kept per
*form*: per cached namespace (``tiers.Tier.namespace``: the form's name and prefix
fingerprint, which an exact or shared form's entries all have), under ``hr:ods:``:

* ``st:<form>``: a hash, sample index -> ``refs * 8 + bit`` (Seneca's status byte and
  reference count): ``bit`` the form's ``TIER_BIT``, present while the entry is held; ``refs``
  the uses of this form's entry (the job that stored it counts as one);
* ``jobs:<form>``: a sorted set of the live jobs that look this form up, member -> the time
  (ms, the server's clock) its registration expires; every request of a live job pushes its
  own forward by ``ttl`` (and removes it from the forms it no longer looks up), and each
  script drops the expired ones, so a job killed with SIGKILL stops counting after ``ttl``.
  Its size is the form's eviction threshold: a job that caches another form, or another
  pipeline's form, neither counts toward it nor adds uses to this form's entries (with one
  count per sample and one threshold per pipeline, a decoded-only job held every augmented
  entry past the jobs that read it, so one job was served it in two epochs, and a decoded
  entry two pipelines shared was evicted by one pipeline's job before the other's used it).
  A member is ``<job>#<token>``: the job's name (``Cache.job``) and a token drawn by each
  loader, so two live loaders given one name (a script launched twice) count as two jobs and
  keep their own seen bits (the second is warned); a restart under its old name registers
  anew, and the dead process's member expires after ``ttl`` like any killed job's;
* ``seen:<digest of member>:<epoch>``: the member's seen bits for that epoch (``SETBIT``), expiring
  ``ttl`` after its last request. The job's own process keeps the authoritative copy
  (``ods.Substitution``, saved in its state dict); this one lets the server filter the
  candidates it returns.

Everything is changed by Lua scripts, so a read-modify-write is atomic across workers and jobs:
``ASK`` (the scheduler, once per sampler batch): register in the forms the job looks up this
epoch (``ods_tiers``: its tracked forms with a budget, a user's ``split`` or MDP's), mark what
was chosen since the last request seen, answer which requested samples one of those forms
holds and draw unseen held ones at random (``HRANDFIELD`` of each form's status). In
``redis_scripts``: ``ODS_USE`` (after a worker's ``GET``, in its ``MULTI``) counts a use of the
entry's form; the entry is evicted when its uses reach the form's live jobs (Seneca's
threshold), its bytes returned to the budget; ``RESERVE`` (a worker's insert, before its
``SET``) sets the status. Those scripts build the form's keys from ``OdsKeys.status`` and
``OdsKeys.jobs`` (prefixes) and the entry's namespace.
No module here imports ``redis``: scripts run on the backend's client.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Mapping, Sequence
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
-- KEYS: [1] the member's seen bits, then per tracked form f its status (KEYS[2f]) and jobs
-- (KEYS[2f + 1]). ARGV: [1] member, [2] ttl, [3] substitutes wanted, [4] one flag per form
-- ('1': the job looks it up), [5] marks m, then the m marks and the requested indices.
local ttl, flags = tonumber(ARGV[2]), ARGV[4]
local sts, jobsets = {}, {}
for f = 1, #flags do
  local st, jobs = KEYS[2 * f], KEYS[2 * f + 1]
  redis.call('ZREMRANGEBYSCORE', jobs, '-inf', now)
  if string.sub(flags, f, f) == '1' then
    redis.call('ZADD', jobs, now + ttl, ARGV[1])
    if redis.call('PTTL', jobs) < ttl then redis.call('PEXPIRE', jobs, ttl) end
    sts[#sts + 1], jobsets[#jobsets + 1] = st, jobs
  else
    redis.call('ZREM', jobs, ARGV[1])  -- not looked up this epoch: not among its users
  end
end
local function held(i)  -- in a form the job looks up
  for _, st in ipairs(sts) do
    if redis.call('HEXISTS', st, i) == 1 then return true end
  end
  return false
end
local nm = tonumber(ARGV[5])
for k = 6, 5 + nm do redis.call('SETBIT', KEYS[1], tonumber(ARGV[k]), 1) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], ttl) end
local hits, req = {}, {}
for k = 6 + nm, #ARGV do
  req[ARGV[k]] = true
  hits[#hits + 1] = held(ARGV[k]) and 1 or 0
end
local want = tonumber(ARGV[3])
local cands, taken = {}, {}
if want > 0 and #sts > 0 then
  local drawn, most = {}, 0
  for f, st in ipairs(sts) do
    local n = math.max(1, math.floor(math.min(want * DRAWS, MOST) / #sts))
    drawn[f] = redis.call('HRANDFIELD', st, n)
    most = math.max(most, #drawn[f])
  end
  for j = 1, most do  -- the forms' draws interleaved; a sample held in two forms once
    for f = 1, #sts do
      local i = drawn[f][j]
      if #cands < want and i and not req[i] and not taken[i]
          and redis.call('GETBIT', KEYS[1], tonumber(i)) == 0 then
        taken[i] = true
        cands[#cands + 1] = tonumber(i)
      end
    end
  end
end
local jobs = 1
if #jobsets > 0 then jobs = math.max(1, #redis.call('ZUNION', #jobsets, unpack(jobsets))) end
return {hits, cands, jobs}
""".replace("DRAWS", str(CANDIDATE_DRAWS)).replace("MOST", str(MAX_DRAW))


class OdsKeys:
    """Key names of ODS's shared state (``prefix``: the backend's key prefix, ``b"hr:"``) for a
    job whose tracked forms are ``forms``: tier name -> the form's namespace (16 bytes,
    ``tiers.Tier.namespace``; its entries' keys start with it)."""

    def __init__(self, prefix: bytes, forms: Mapping[str, bytes]) -> None:
        self.forms = dict(forms)
        self.base = prefix + b"ods:"
        self.status = self.base + b"st:"
        """Prefix of a form's status hash: ``status + namespace`` (the scripts append it)."""
        self.jobs = self.base + b"jobs:"
        """Prefix of a form's live jobs: ``jobs + namespace``."""

    def status_of(self, tier: str) -> bytes:
        """The status hash of the job's form ``tier``."""
        return self.status + self.forms[tier]

    def jobs_of(self, tier: str) -> bytes:
        """The live jobs that look up the job's form ``tier``."""
        return self.jobs + self.forms[tier]

    def seen(self, member: str, epoch: int) -> bytes:
        """The seen bits of ``member`` (``OdsBoard.member``: job name and token) in ``epoch``:
        named by a digest of the member (32 hex digits), so that the name is longer than any
        entry's key, which ``RedisBackend.scan_bytes`` tells apart by its length
        (``hr:ods:seen:`` and a short member made 27 bytes, an entry key's length)."""
        digest = hashlib.blake2b(member.encode(), digest_size=16).hexdigest()
        return self.base + f"seen:{digest}:{epoch}".encode()


def _redis_bits(lsb_first: bytes) -> bytes:
    """``runtime.bitmap.Bitmap``'s bytes (bit i at ``1 << i % 8``) in Redis's bit order
    (``SETBIT`` offset i is bit ``7 - i % 8`` of byte ``i // 8``)."""
    return lsb_first.translate(_REVERSE)


_REVERSE = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


class OdsBoard:
    """One job's view of ODS's shared state (training process; scheduler thread).

    ``backend``: a ``RedisBackend`` (its client runs the scripts; its ``ods``, which the
    session's plan sets each epoch, are the keys used, ``keys`` until it has some); ``job``:
    the job's name (``Cache.job``); ``ttl_s``: how long the job's registration and seen bits
    outlive its last request (seconds).
    """

    def __init__(self, backend: Any, keys: OdsKeys, job: str, ttl_s: float) -> None:
        self.backend = backend
        self._keys = keys
        self._joined: set[bytes] = set()  # the forms' jobs sets this board registered in
        self.job = job
        self.member = f"{job}#{uuid.uuid4().hex[:8]}"
        """This loader's registration among its forms' live jobs and the name of its seen
        bits: the job's name and a token of this board, so that another live loader given the
        same name neither hides this one's candidates nor counts as the same job."""
        self._checked = False  # whether the name was checked against the live members
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.errors = 0
        """Requests that failed (the server down): their positions were filled without ODS."""
        self.jobs = 1
        """Live jobs at the last answer."""

    @property
    def keys(self) -> OdsKeys:
        """The keys of the running epoch's forms."""
        return self.backend.ods if isinstance(self.backend.ods, OdsKeys) else self._keys

    def _looked_up(self) -> list[str]:
        """The job's tracked forms it looks up this epoch (``ods_tiers``), in a fixed order."""
        return sorted(t for t in self.backend.ods_tiers if t in self.keys.forms)

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
        """Warn when another live member of this job's forms has its name (registered, once,
        right after this board's first registration dropped the expired ones)."""
        try:
            r = self.backend._r()
            members = {m for t in self._looked_up() for m in r.zrange(self.keys.jobs_of(t), 0, -1)}
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
        ``marks`` seen first. Cached means in a form this job looks up: the backend's
        ``ods_tiers``, which the session's plan sets each epoch (its tracked forms with a
        budget); the job is registered among those forms' live jobs and removed from its
        other tracked forms'. ``NO_ANSWER`` when the server fails."""
        k = self.keys
        forms = sorted(k.forms)
        looked = set(self._looked_up())
        keys = [k.seen(self.member, epoch)]
        for t in forms:
            keys += [k.status_of(t), k.jobs_of(t)]
        flags = "".join("1" if t in looked else "0" for t in forms)
        try:
            script = self._script("ods_ask")
            hits, cands, jobs = self.backend._call(lambda: script(
                keys=keys,
                args=[self.member, self.ttl_ms, want, flags, len(marks), *marks, *requested]))
        except Exception:  # noqa: BLE001 - counted; the positions are filled as misses
            self.errors += 1
            return NO_ANSWER
        self._joined |= {k.jobs_of(t) for t in looked}
        self.jobs = int(jobs)
        return Answer([bool(h) for h in hits], [int(c) for c in cands], self.jobs)

    def leave(self) -> None:
        """Unregister from every form it registered in (a job that closes; a killed one
        expires after ``ttl``)."""
        try:
            r = self.backend._r()
            for jobs in self._joined:
                r.zrem(jobs, self.member)
        except Exception:  # noqa: BLE001 - it expires anyway
            pass
