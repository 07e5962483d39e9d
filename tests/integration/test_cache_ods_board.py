"""ODS's shared state on a real redis-server, driven directly (no loader): status, reference
counts, eviction at the number of live jobs, expiry of a job's registration."""

from __future__ import annotations

import logging
import time

import pytest

import headrace as hr
from headrace.cache import codec, session_ods
from headrace.cache.ods_board import OdsBoard, OdsKeys
from headrace.cache.redis_backend import PREFIX, RedisBackend
from headrace.cache.tiers import TierLayout, sample_key

pytestmark = [pytest.mark.integration, pytest.mark.redis]
NS = b"n" * 16
NS_D, NS_E = b"d" * 16, b"e" * 16
"""Namespaces of the decoded and encoded forms (``NS``: the augmented one)."""


@pytest.fixture
def backend(redis_server):
    redis_server.flush()
    be = RedisBackend(redis_server.url, 1 << 20)
    be.set_budgets({"augmented": 1 << 20})
    be.ods = OdsKeys(PREFIX, {"augmented": NS, "decoded": NS_D, "encoded": NS_E})
    be.ods_tiers = frozenset({"augmented"})
    be.ods_always = frozenset({"augmented"})  # a shared augmented form: never kept for later
    yield be
    be.close_here()


def _boards(be: RedisBackend, n: int) -> list[OdsBoard]:
    boards = [OdsBoard(be, be.ods, f"job{k}", 60.0) for k in range(n)]
    for b in boards:
        b.start_epoch(0, b"")
    return boards


def _put(be: RedisBackend, index: int) -> str:
    return be.put(sample_key(NS, index), "augmented", codec.encode(b"x" * 100), [])


def _read(be: RedisBackend, index: int):
    return be.take(sample_key(NS, index), "augmented", codec.decode)


@pytest.mark.parametrize("jobs", [2, 3])
def test_an_entry_is_evicted_once_every_live_job_used_it(backend, jobs) -> None:
    _boards(backend, jobs)
    assert _put(backend, 7) == "stored"  # the storing job counts as one use
    stored = backend.usage()["augmented"]
    assert stored > 0
    for k in range(jobs - 1):
        assert _read(backend, 7) == b"x" * 100  # the other jobs, one use each
        left = k + 1 < jobs - 1
        assert bool(backend.usage()["augmented"]) == left  # bytes back in the budget at the last
    assert _read(backend, 7) is None
    board = OdsBoard(backend, backend.ods, "job0", 60.0)
    ans = board.ask(0, [7], 4, [])
    assert ans.hits == [False] and 7 not in ans.candidates  # no longer offered
    assert backend.scan_bytes() == 0


def test_an_exact_form_every_job_used_is_evicted_only_when_its_tier_is_full(backend) -> None:
    _boards(backend, 2)
    blob = codec.encode(b"d" * 100)
    cost = len(PREFIX) + 24 + len(blob) + 64 + 32  # key, value, overhead, ODS status
    backend.set_budgets({"decoded": 2 * cost})
    backend.ods_tiers, backend.ods_always = frozenset({"decoded"}), frozenset()
    assert backend.put(sample_key(NS_D, 1), "decoded", blob, []) == "stored"
    assert backend.take(sample_key(NS_D, 1), "decoded", codec.decode) == b"d" * 100
    assert backend.scan_bytes() == cost  # every job used it, but there is room: kept
    assert backend.put(sample_key(NS_D, 2), "decoded", blob, []) == "stored"
    assert backend.put(sample_key(NS_D, 3), "decoded", blob, []) == "full"  # now it is needed
    assert backend.take(sample_key(NS_D, 1), "decoded", codec.decode) == b"d" * 100
    assert backend.scan_bytes() == cost  # evicted: entry 2 is left
    assert backend.put(sample_key(NS_D, 3), "decoded", blob, []) == "stored"  # the refill
    assert backend.scan_bytes() == sum(backend.usage().values()) == 2 * cost


def test_answers_say_what_is_cached_and_offer_only_unseen_samples(backend) -> None:
    a, b = _boards(backend, 2)
    for i in (1, 2, 3):
        _put(backend, i)
    ans = a.ask(0, [1, 9], 8, [])
    assert ans.hits == [True, False] and ans.jobs == 2
    assert sorted(ans.candidates) == [2, 3]  # requested ones are not offered again
    ans = a.ask(0, [9], 8, [2])  # 2 was chosen since the last request: marked seen
    assert sorted(ans.candidates) == [1, 3]
    assert sorted(b.ask(0, [9], 8, []).candidates) == [1, 2, 3]  # seen bits are per job


def test_a_silent_job_stops_counting_after_its_ttl(backend, redis_server) -> None:
    import redis

    _boards(backend, 1)  # job0, 60 s
    dead = OdsBoard(backend, backend.ods, "dead", 0.3)
    dead.start_epoch(0, b"\x01")
    r = redis.Redis.from_url(redis_server.url)
    assert r.zscore(backend.ods.jobs_of("augmented"), dead.member) is not None
    assert r.exists(backend.ods.seen(dead.member, 0))
    deadline = time.monotonic() + 10.0
    live = OdsBoard(backend, backend.ods, "live", 60.0)
    while live.ask(0, [], 0, []).jobs != 2 or r.exists(backend.ods.seen(dead.member, 0)):
        assert time.monotonic() < deadline, "the silent job did not expire"
        time.sleep(0.05)  # waiting for the server's clock to pass its TTL
    assert r.zscore(backend.ods.jobs_of("augmented"), dead.member) is None  # dropped by the live job's request


def _named_twice(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "headrace" and "registered by another loader" in r.getMessage()]


def test_two_live_loaders_given_one_name_keep_their_own_seen_bits(backend, caplog) -> None:
    # with one seen key per name, each one's marks hid the other's candidates, the second's
    # start deleted the first's bits, and both counted as a single live job
    for i in (1, 2, 3):
        _put(backend, i)
    a = OdsBoard(backend, backend.ods, "train", 60.0)
    a.start_epoch(0, b"")
    a.ask(0, [9], 0, [2])  # a chose 2 since its last request: marked seen for a
    with caplog.at_level(logging.WARNING, logger="headrace"):
        b = OdsBoard(backend, backend.ods, "train", 60.0)
        b.start_epoch(0, b"")
    ans = b.ask(0, [9], 8, [])
    assert sorted(ans.candidates) == [1, 2, 3] and ans.jobs == 2  # a's marks are a's alone
    assert sorted(a.ask(0, [9], 8, []).candidates) == [1, 3]  # b's start left a's bits
    assert len(_named_twice(caplog)) == 1 and "'train'" in _named_twice(caplog)[0]
    a.leave()
    b.leave()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="headrace"):
        again = OdsBoard(backend, backend.ods, "train", 60.0)  # the name reused after a close
        again.start_epoch(0, b"\x02")  # a resumed epoch: index 1 delivered before
    assert _named_twice(caplog) == []
    ans = again.ask(0, [9], 8, [])
    assert ans.jobs == 1 and sorted(ans.candidates) == [2, 3]


def test_answers_count_only_the_tiers_the_job_looks_up(backend) -> None:
    # any tier bit counted as cached: a job caching decoded was offered another job's encoded
    # entries, which it never looks up, and every such substitute missed
    a, = _boards(backend, 1)
    backend.set_budgets({"encoded": 1 << 19, "decoded": 1 << 19})
    backend.ods_tiers, backend.ods_always = frozenset({"encoded", "decoded"}), frozenset()
    blob = codec.encode(b"e" * 100)
    for i in (1, 2):
        assert backend.put(sample_key(NS_E, i), "encoded", blob, []) == "stored"
    for i in (3, 4):
        assert backend.put(sample_key(NS_D, i), "decoded", blob, []) == "stored"
    backend.ods_tiers = frozenset({"decoded"})  # the job's active tiers this epoch
    ans = a.ask(0, [1, 3, 9], 8, [])
    assert ans.hits == [False, True, False] and ans.candidates == [4]
    backend.ods_tiers = frozenset({"encoded"})
    ans = a.ask(0, [1, 3, 9], 8, [])
    assert ans.hits == [True, False, False] and ans.candidates == [2]
    backend.ods_tiers = frozenset()  # no tier with a budget: nothing is cached for it
    ans = a.ask(0, [1, 3, 9], 8, [])
    assert ans.hits == [False, False, False] and ans.candidates == []


# -- jobs caching other forms: uses and the eviction threshold are per form --------------------

class _Src:
    def __len__(self) -> int:
        return 100

    def load(self, i: int) -> bytes:
        return bytes([i % 256]) * 100


def _decode(x):
    return x


def _flip(x, rng):
    return x


def _jitter(x, rng):
    return x


def _layout(*augment):
    steps = [hr.step(_decode, kind="decode"), *(hr.step(f, random=True) for f in augment)]
    return TierLayout.for_pipeline(hr.Pipeline(_Src(), steps), True)  # shared augmented


class _Job:
    """One job on the shared server: its own backend, forms planned as the session plans them
    (``session_ods.plan``), its board registered for epoch 0."""

    def __init__(self, url: str, layout: TierLayout, active: tuple[str, ...], name: str) -> None:
        self.layout = layout
        self.be = RedisBackend(url, 1 << 20)
        self.be.set_budgets({t: 1 << 19 for t in active})
        session_ods.plan(self.be, layout, active)
        self.board = session_ods.board(self.be, name, 60.0)
        self.board.start_epoch(0, b"")

    def key(self, tier: str, index: int) -> bytes:
        tiers = {t.name: t for t in self.layout.tiers}
        return sample_key(tiers[tier].namespace(0, 0), index)

    def put(self, tier: str, index: int) -> str:
        return self.be.put(self.key(tier, index), tier, codec.encode(b"v" * 100), [])

    def read(self, tier: str, index: int):
        return self.be.take(self.key(tier, index), tier, codec.decode)


@pytest.fixture
def jobs(redis_server):
    redis_server.flush()
    made: list[_Job] = []

    def job(layout: TierLayout, active: tuple[str, ...], name: str) -> _Job:
        made.append(_Job(redis_server.url, layout, active, name))
        return made[-1]

    yield job
    for j in made:
        j.board.leave()
        j.be.close_here()


def test_a_job_caching_another_form_is_not_in_the_threshold(jobs) -> None:
    # one count per sample and one threshold per pipeline: a decoded-only job counted among
    # the jobs an augmented entry waits for, so the entry outlived the jobs that read it and
    # the job that stored it was served it again in its next epoch
    lay = _layout(_flip)
    a, b = jobs(lay, ("augmented",), "a"), jobs(lay, ("augmented",), "b")
    c = jobs(lay, ("decoded",), "c")
    assert c.put("decoded", 7) == "stored"
    assert a.put("augmented", 7) == "stored"  # a's use
    assert b.read("augmented", 7) == b"v" * 100  # b's: every job reading augmented used it
    assert a.read("augmented", 7) is None  # evicted: never served across a's epochs
    assert c.read("decoded", 7) == b"v" * 100  # c's own form, kept (its tier has room)
    assert a.board.ask(1, [7], 0, []).hits == [False]


def test_uses_of_another_form_do_not_age_an_entry(jobs) -> None:
    # a decoded job's reads of sample 7 counted as uses of its augmented entry, which was
    # evicted before the third augmented job had it
    lay = _layout(_flip)
    a, b, e = (jobs(lay, ("augmented",), n) for n in "abe")
    c = jobs(lay, ("decoded",), "c")
    assert a.put("augmented", 7) == "stored"
    assert c.put("decoded", 7) == "stored"
    assert c.read("decoded", 7) == b"v" * 100
    assert c.read("decoded", 7) == b"v" * 100  # c's next epoch
    assert b.read("augmented", 7) == b"v" * 100
    assert e.read("augmented", 7) == b"v" * 100  # the last augmented job still has it
    assert a.read("augmented", 7) is None  # then it is gone


def test_pipelines_sharing_a_form_share_its_entries_and_threshold(jobs) -> None:
    # two pipelines with the same decoded prefix (other augmentations) share decoded entries:
    # with one status hash and one threshold per pipeline, the second pipeline's job was not
    # offered the first's entries, and its one use evicted an entry the first's other job had
    # not had yet
    a, c = jobs(_layout(_flip), ("decoded",), "a"), jobs(_layout(_flip), ("decoded",), "c")
    b = jobs(_layout(_jitter), ("decoded",), "b")
    assert a.key("decoded", 7) == b.key("decoded", 7)
    for i in (7, 8):
        assert a.put("decoded", i) == "stored"  # a's use
    ans = b.board.ask(0, [7, 9], 8, [])
    assert ans.hits == [True, False] and ans.candidates == [8] and ans.jobs == 3
    b.be.set_budgets({"decoded": b.be.usage()["decoded"]})  # room for no more
    assert b.put("decoded", 9) == "full"  # the tier is under pressure: used entries go
    assert b.read("decoded", 8) == b"v" * 100  # b's use
    assert c.read("decoded", 8) == b"v" * 100  # c's: the last one owed
    assert a.read("decoded", 8) is None
