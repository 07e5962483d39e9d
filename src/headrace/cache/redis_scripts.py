"""The Lua scripts every Redis entry operation runs (budget, expiry, ODS status), as text.

One calling convention: ``KEYS = [entry, used, namespaces, ns_used, status, jobs]`` (the last
two for ODS only: prefixes, ``ods_board.OdsKeys``, to which the scripts append the entry's
namespace, so that uses are counted per form and the threshold is that form's live jobs) and ``ARGV = [tier, ttl_ms, namespace, ns_used_prefix, ledger, ...]``:

* ``used`` (``hr:used``): bytes per tier, all live namespaces together: the budget check;
* ``namespaces`` (``hr:ns``): a sorted set, namespace -> the time (server ms) it expires: every
  insert or hit pushes it to ``now + ttl``; every entry gets the same TTL (``PX``) and a hit
  refreshes it, so a namespace's entries have all expired once it has;
* ``ns_used`` (``hr:nsused:<namespace>``): that namespace's bytes per tier. An insert first
  *reaps* expired namespaces: their bytes leave ``used``. So entries of a pipeline that changed
  (another prefix fingerprint: another namespace), or of a dataset no job reads any more,
  leave Redis by TTL and stop holding the budget, without a scan of the key space;
* ``ledger`` (``'1'``: on): where Redis itself may remove entries (an evicting
  ``maxmemory-policy``, ``redis_limits``), ``ns_used`` also holds a record of each *stored*
  entry (field: the key's last 8 bytes; value ``"<bytes>:<expiry>"``, its cost and the server
  time in ms its TTL runs out, pushed forward by every hit) and the namespace's tier (field
  ``t``: a plain lookup does not pass it). An insert records its entry in the ``MULTI`` of its
  ``SET``, just before it (``CONFIRM``), never at its reservation: a lookup between another
  job's reservation and its ``SET`` finds no record, so it gives nothing back. A lookup that
  finds a recorded entry gone gives its bytes back, so the count follows what Redis holds
  within an epoch (each epoch looks every sample up). Gone before its expiry, the entry was
  evicted: the tier then holds at most what the server held after its evictions (its
  *ceiling*: the count at the first such miss less every evicted entry found since, for
  ``CEILING_S`` after the last), so a budget the server cannot hold is not refilled into its
  evictions every epoch (under LRU a cyclic scan larger than what is held hits nothing);
  gone after it, it expired (not hit for ``ttl``): its bytes come back and the ceiling stays
  as it is (the server had room for it). Entries headrace evicts itself (ODS) make room under
  the ceiling. An insert that finds its tier full, or its total gone, first recounts the total
  from the live namespaces' own counts (under ``allkeys-*`` Redis may evict ``used`` or a
  namespace's hash: the count then errs low, and the server's ``maxmemory`` bounds what is
  held): every namespace, in pages of ``RECOUNT_PAGE``, at most once per ``RECOUNT_S`` per
  tier (a total that is gone always), and never more than ``RECOUNT_MOST`` namespaces (more:
  the count stays as it is; a total that is gone is then the sum of the first ``RECOUNT_MOST``,
  low). A count never goes below 0.

An expired entry still counted in a live namespace (not hit for ``ttl``) keeps its bytes in
``used`` until its namespace expires (without a ledger): the budget errs on the side of holding
less. Key names are built inside the scripts (``ns_used_prefix .. namespace``): a single server, not a Redis
Cluster. Nothing here imports ``redis``.

**Values never pass through Lua.** A script that reads or writes a value copies it into a Lua
string and back: measured on this machine, a script returning an 837 KB decoded image took
3.1 ms against 0.78 ms for a plain ``GET``, and a refused insert that carried the blob 3.0 ms,
as long as decoding the JPEG again (3.7 ms). So values move with plain ``GET`` / ``SET``, and
the scripts do only the bookkeeping, with the value's length from ``STRLEN``: a lookup is a
``MULTI`` of ``GET`` and a bookkeeping script (atomic, one round trip); an insert first
*reserves* its bytes in the budget and sets its ODS status (a small script; a full tier costs
one small call and no blob on the wire), then sends a plain ``SET ... NX`` (with the ledger,
in one ``MULTI`` after ``CONFIRM``). A process that dies
between reserving and setting leaves its reservation counted until the namespace expires: the
budget errs on the side of holding less. A lookup in that moment finds no value and clears the
status (the entry then waits for a lookup by its own index to be marked again).

*Past ``maxmemory``* (``noeviction``, Redis's default), Redis refuses every command that may
grow its memory, and every command queued in a ``MULTI``. On Redis >= 7 the bookkeeping scripts
declare ``allow-oom`` (``flagged``): they run past the limit (they change a few counters and
free entries), so a lookup outside a ``MULTI`` still reads, counts and evicts, and a refused
``SET`` gives its reservation back; ``RESERVE`` does not, so an insert is refused up front.
Before Redis 7 (no flags) they are refused there like any write, and a refused ``SET``'s bytes
stay counted until their namespace expires.

ODS evicts an entry once every live job that looks up its form used it. A shared augmented form always (Seneca: never
served in another epoch); an exact form (encoded, decoded) only while its tier is under
pressure, i.e. an insert was refused in the last ``PRESSURE_S``: when everything fits, an entry
every job used this epoch is what every job needs next epoch, and evicting it would only make
the next epoch miss; when the tier is full, its room goes to a sample no job has yet.
"""

from __future__ import annotations

PRESSURE_S = 10.0
"""An exact tier counts as under pressure this long after an insert was refused (seconds)."""
CEILING_S = 60.0
"""With the ledger: after a lookup found an entry Redis evicted, the tier holds at most what the
server held after its evictions, for this long (seconds); then the budget applies again."""
RECOUNT_S = 5.0
"""With the ledger: a tier's total is recounted from its namespaces at most once this long
(seconds), so a full tier does not sum every namespace on each refused insert."""
RECOUNT_PAGE = 1000
"""Namespaces a recount reads with one ``ZRANGE`` (a bounded reply inside the script)."""
RECOUNT_MOST = 4096
"""The most namespaces a recount sums (the server runs nothing else meanwhile): 3.0 ms for
4,096 on this machine, 0.18 ms for 256, 12 ms for 10,000 (a loaded 2-core machine)."""

_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tier, ttl, ns, nsp = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
-- ODS: the entry's form's status hash and live jobs (ods_board: prefixes + its namespace)
local ods_st, ods_jobs = KEYS[5] and KEYS[5] .. ns, KEYS[6] and KEYS[6] .. ns
local ledger, field = ARGV[5] == '1', string.sub(KEYS[1], -8)
local function add(key, t, n)  -- never below 0 (under allkeys-* Redis may evict the counts)
  if n == 0 then return end  -- a Lua -0 reaches Redis as "-0", which HINCRBY refuses
  if redis.call('HINCRBY', key, t, n) < 0 then redis.call('HSET', key, t, 0) end
end
local function charge(n)
  add(KEYS[2], tier, n)
  add(KEYS[4], tier, n)
end
local function entry()  -- the ledger's record: the entry's bytes, when its TTL runs out
  local rec = redis.call('HGET', KEYS[4], field)
  if not rec then return nil end
  local n, due = string.match(rec, '^(%d+):?(%d*)$')
  return tonumber(n), tonumber(due)
end
local function record(n)  -- the stored entry's n bytes, its TTL running out now + ttl
  if not ledger then return end
  redis.call('HSET', KEYS[4], field, string.format('%d:%d', n, now + ttl))
  redis.call('HSETNX', KEYS[4], 't', tier)
end
local function seen()  -- a hit refreshed the entry's TTL: so does its record
  if not ledger then return end
  local n = entry()
  if n then redis.call('HSET', KEYS[4], field, string.format('%d:%d', n, now + ttl)) end
end
local function forget()  -- the entry left (evicted by headrace): its record goes
  if ledger then redis.call('HDEL', KEYS[4], field) end
end
local function recount(t)  -- tier t's total from the live namespaces' own counts
  local many = redis.call('ZCARD', KEYS[3]) > RECOUNT_MOST
  local kept = redis.call('HGET', KEYS[2], t)
  if many and kept then return tonumber(kept) end  -- too many to sum: the count as it is
  local n, i = 0, 0
  repeat
    local page = redis.call('ZRANGE', KEYS[3], i, math.min(i + RECOUNT_PAGE, RECOUNT_MOST) - 1)
    for _, s in ipairs(page) do
      n = n + tonumber(redis.call('HGET', nsp .. s, t) or '0')
    end
    i = i + RECOUNT_PAGE
  until #page < RECOUNT_PAGE or i >= RECOUNT_MOST
  redis.call('HSET', KEYS[2], t, n)
  return n
end
local function total(t)  -- tier t's total, recounted at most once per RECOUNT_S (gone: always)
  local kept = redis.call('HGET', KEYS[2], t)
  if kept and not redis.call('SET', KEYS[2] .. ':recounted:' .. t, 1, 'PX', RECOUNT_MS, 'NX')
  then return tonumber(kept) end
  return recount(t)
end
local function gone()  -- the entry is not there: give back what the ledger still counts
  if not ledger then return end
  local n, due = entry()
  if not n then return end  -- not recorded: never stored, or already given back
  local t = redis.call('HGET', KEYS[4], 't') or tier
  if due and now < due then  -- evicted before its TTL ran out (see RESERVE): what the server
    local ceiling = KEYS[2] .. ':ceiling:' .. t  -- held after its evictions
    local held = tonumber(redis.call('GET', ceiling) or total(t)) - n
    redis.call('SET', ceiling, math.max(held, 0), 'PX', CEILING_MS)
  end
  add(KEYS[2], t, -n)
  add(KEYS[4], t, -n)
  redis.call('HDEL', KEYS[4], field)
end
local function touch()
  redis.call('ZADD', KEYS[3], 'GT', now + ttl, ns)
end
local function reap()
  for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 64)) do
    local tiers = {'encoded', 'decoded', 'augmented'}  -- not the ledger's fields
    for k, n in ipairs(redis.call('HMGET', nsp .. old, unpack(tiers))) do
      if n then add(KEYS[2], tiers[k], -tonumber(n)) end
    end
    redis.call('UNLINK', nsp .. old)
    redis.call('ZREM', KEYS[3], old)
  end
end
local function status(index, bit, refs_delta, evicted)
  local s = tonumber(redis.call('HGET', ods_st, index) or '0')
  local refs, mask = math.floor(s / 8) + refs_delta, s % 8
  local has = math.floor(mask / bit) % 2 == 1
  if evicted and has then mask = mask - bit; refs = 0 end
  if not evicted and not has then mask = mask + bit end
  if mask == 0 then redis.call('HDEL', ods_st, index)
  else
    redis.call('HSET', ods_st, index, math.max(refs, 0) * 8 + mask)
    redis.call('PEXPIRE', ods_st, ttl)  -- outlives no entry by more than their TTL
  end
end
"""
for _name, _value in (("PRESSURE_MS", PRESSURE_S * 1000), ("CEILING_MS", CEILING_S * 1000),
                      ("RECOUNT_MS", RECOUNT_S * 1000), ("RECOUNT_PAGE", RECOUNT_PAGE),
                      ("RECOUNT_MOST", RECOUNT_MOST)):
    _PRELUDE = _PRELUDE.replace(_name, str(int(_value)))

RESERVE = _PRELUDE + """
-- ARGV[6] cost, ARGV[7] budget; ODS: ARGV[8] index, ARGV[9] tier bit.
-- 'stored': the bytes are charged (and the ODS status set): SET the value next.
reap()
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
local used, limit = tonumber(redis.call('HGET', KEYS[2], tier) or '-1'), tonumber(ARGV[7])
if ledger then  -- the most the server held after it evicted an entry (gone)
  limit = math.min(limit, tonumber(redis.call('GET', KEYS[2] .. ':ceiling:' .. tier) or limit))
  if used < 0 or used + tonumber(ARGV[6]) > limit then used = total(tier) end
end
used = math.max(used, 0)
if used + tonumber(ARGV[6]) > limit then
  redis.call('SET', KEYS[2] .. ':full:' .. tier, 1, 'PX', PRESSURE_MS)  -- see ODS_USE
  return 'full'
end
charge(tonumber(ARGV[6]))  -- recorded in the ledger by CONFIRM, with the SET
touch()
if ARGV[8] then
  local s = tonumber(redis.call('HGET', ods_st, ARGV[8]) or '0')
  if s < 8 then status(ARGV[8], tonumber(ARGV[9]), 1, false)  -- the storing job: one use
  else status(ARGV[8], tonumber(ARGV[9]), 0, false) end
end
return 'stored'
""".replace("PRESSURE_MS", str(int(PRESSURE_S * 1000)))

REFUND = _PRELUDE + """
-- ARGV[6] cost (0: nothing was reserved): a reservation whose SET found the entry there
-- already (another writer), or, ARGV[7] '1', whose SET (or RESERVE) Redis refused for memory:
-- then the tier counts as full (see ODS_USE) and, ODS (ARGV[8] index, ARGV[9] tier bit), the
-- sample is no longer offered as cached
local n = tonumber(ARGV[6])
if n > 0 then charge(-n) end
if ARGV[7] == '1' then
  redis.call('SET', KEYS[2] .. ':full:' .. tier, 1, 'PX', PRESSURE_MS)
  if ARGV[8] and redis.call('HEXISTS', ods_st, ARGV[8]) == 1 then
    status(ARGV[8], tonumber(ARGV[9]), 0, true)
  end
end
return 1
""".replace("PRESSURE_MS", str(int(PRESSURE_S * 1000)))

CONFIRM = _PRELUDE + """
-- With the ledger, just before the insert's SET ... NX in one MULTI (nothing runs between):
-- ARGV[6] the bytes RESERVE charged. 'stored': the entry is not there, so the SET stores it:
-- its record goes in the ledger now, never before (a lookup between RESERVE and here finds no
-- record, so gives nothing back). 'exists': another writer stored it, recorded: the SET will
-- find it there; the reservation goes back, once. A stored entry with no record (its writer's
-- MULTI refused this script as not loaded; it retries) is recorded with this reservation.
local n = tonumber(ARGV[6])
if redis.call('EXISTS', KEYS[1]) == 1 and entry() then
  charge(-n)
  return 'exists'
end
record(n)
return 'stored'
"""

TOUCH = _PRELUDE + """
-- after a GET in the same MULTI: a hit refreshes the entry's and its namespace's TTL
if redis.call('PEXPIRE', KEYS[1], ttl) == 1 then touch(); seen() else gone() end
return 1
"""

DROP = _PRELUDE + """
-- after a GET in the same MULTI (a shared augmented form is served once): ARGV[6] an entry's
-- bytes beside its value (key, overhead, ledger record)
local n = redis.call('STRLEN', KEYS[1])
if n > 0 then
  redis.call('DEL', KEYS[1])
  charge(-(n + tonumber(ARGV[6])))
  forget()
else
  gone()
end
return n
"""

ODS_USE = _PRELUDE + """
-- after a GET in the same MULTI. ARGV[6] bytes beside the value, ARGV[7] index, ARGV[8] tier
-- bit, ARGV[9] '1': evict at the threshold always (a shared augmented form), else only while
-- the tier refuses inserts. A read counts one use of this form's entry; once every live job
-- looking up the form used it, it is evicted and its bytes return to the budget.
local index, bit = ARGV[7], tonumber(ARGV[8])
local n = redis.call('STRLEN', KEYS[1])
if n == 0 then
  if redis.call('HEXISTS', ods_st, index) == 1 then status(index, bit, 0, true) end
  gone()
  return 0
end
local jobs = math.max(1, redis.call('ZCOUNT', ods_jobs, '(' .. now, '+inf'))
local refs = math.floor(tonumber(redis.call('HGET', ods_st, index) or '0') / 8) + 1
local pressed = ARGV[9] == '1' or redis.call('EXISTS', KEYS[2] .. ':full:' .. tier) == 1
if refs >= jobs and pressed then
  redis.call('DEL', KEYS[1])
  charge(-(n + tonumber(ARGV[6])))
  forget()
  status(index, bit, 1, true)
else
  redis.call('PEXPIRE', KEYS[1], ttl)
  touch()
  seen()
  status(index, bit, 1, false)
end
return n
"""


ALLOW_OOM = "#!lua flags=allow-oom\n"
"""First line of a bookkeeping script on Redis >= 7: it runs past ``maxmemory``."""
NO_FLAGS = "#!lua\n"
"""First line of ``RESERVE`` on Redis >= 7: refused up front past ``maxmemory`` (a script that
declares no flags may grow memory), before it charges anything."""


def flagged(name: str, text: str, allow_oom: bool) -> str:
    """Script ``text`` (``name``: its name in the backend) as the server runs it: with its
    flags on Redis >= 7 (``allow_oom``: the server takes them), as is before."""
    if not allow_oom:
        return text
    return (NO_FLAGS if name == "reserve" else ALLOW_OOM) + text
