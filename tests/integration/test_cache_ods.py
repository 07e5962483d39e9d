"""ODS (``Cache(ods=True)``) with jobs in separate processes sharing a real redis-server:
each job sees every sample exactly once per epoch, a killed job's state expires and its restart
resumes exactly, a mid-epoch state dict resumes exactly in a new process, budgets hold."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import time

import pytest
import torch

import headrace as hr
from headrace.cache.ods_board import OdsKeys
from headrace.cache.redis_backend import PREFIX, RedisBackend
from tests.integration import ods_jobs
from tests.integration.test_cache import N, samples

pytestmark = [pytest.mark.integration, pytest.mark.redis]
JOIN_S = 240.0
"""Longest a job process may take (bounded; a few seconds expected)."""


@pytest.fixture
def server(redis_server):
    redis_server.flush()
    return redis_server


def _spawn(ctx, **kw) -> mp.Process:
    p = ctx.Process(target=ods_jobs.run_job, kwargs=kw)
    p.start()
    return p


def _join(*procs: mp.Process) -> None:
    for p in procs:
        p.join(JOIN_S)
        assert not p.is_alive(), "a job did not finish in time"


def _read(path) -> list[dict]:
    with open(path) as f:
        return json.load(f)["epochs"]


def _budget_held(url: str) -> None:
    """Every entry read back from the server: within the budget, and as counted."""
    be = RedisBackend(url, ods_jobs.BUDGET)
    be.ods = True
    measured = be.scan_bytes()
    assert measured <= ods_jobs.BUDGET
    assert measured == sum(be.usage().values())
    be.close_here()


def _form_keys(url: str) -> OdsKeys:
    """The ODS keys of the jobs' one cached form (``split={"decoded": 1.0}``), as "decoded"."""
    import redis

    r = redis.Redis.from_url(url)
    st = [k for k in r.scan_iter(match=PREFIX + b"ods:st:*")]
    assert len(st) == 1, st  # the jobs share one form (same pipeline prefix)
    return OdsKeys(PREFIX, {"decoded": st[0][len(PREFIX + b"ods:st:"):]})


def test_three_concurrent_jobs_each_see_every_sample_once_per_epoch(server, no_leaks,
                                                                     tmp_path) -> None:
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(3)
    outs = [str(tmp_path / f"job{k}.json") for k in range(3)]
    procs = [_spawn(ctx, url=server.url, job=f"job{k}", seed=10 + k, epochs=2, out=outs[k],
                    start=start, workers=1 if k < 2 else 0) for k in range(3)]
    _join(*procs)
    assert all(p.exitcode == 0 for p in procs)
    substituted = 0
    for out in outs:
        for e in _read(out):
            assert sorted(e["indices"]) == list(range(N))  # exactly once, whatever was swapped
            substituted += e["cache"]["substituted"]
            assert e["cache"]["jobs"] >= 1
    assert substituted > 0  # ODS did replace misses with hits
    _budget_held(server.url)
    import redis

    r = redis.Redis.from_url(server.url)
    keys = _form_keys(server.url)
    assert r.zcard(keys.jobs_of("decoded")) == 0  # jobs that closed left the form's jobs
    assert r.hlen(keys.status_of("decoded")) > 0


def test_a_killed_job_expires_and_its_restart_resumes_exactly(server, no_leaks,
                                                             tmp_path) -> None:
    import redis

    ttl = 1.0
    ctx = mp.get_context("spawn")
    start, stopped = ctx.Barrier(3), ctx.Event()
    outs = [str(tmp_path / f"job{k}.json") for k in range(3)]
    state = str(tmp_path / "victim.pt")
    others = [_spawn(ctx, url=server.url, job=f"job{k}", seed=20 + k, epochs=2, out=outs[k],
                     start=start, ttl_s=ttl) for k in range(2)]
    victim = _spawn(ctx, url=server.url, job="victim", seed=22, epochs=1, out=outs[2],
                    start=start, ttl_s=ttl, stop_after=5, state_path=state, stopped=stopped,
                    workers=1)
    assert stopped.wait(JOIN_S)
    keys = _form_keys(server.url)
    jobs = keys.jobs_of("decoded")
    r = redis.Redis.from_url(server.url)
    member, = [m.decode() for m in r.zrange(jobs, 0, -1) if m.startswith(b"victim#")]
    assert r.exists(keys.seen(member, 0))  # registered while alive
    os.kill(victim.pid, signal.SIGKILL)
    _join(victim, *others)
    for out in outs[:2]:  # the others complete, exactly once per epoch
        for e in _read(out):
            assert sorted(e["indices"]) == list(range(N))
    # the victim's registration and seen bits expire after its TTL (the server's clock)
    deadline = time.monotonic() + 10 * ttl
    while r.zscore(jobs, member) is not None or r.exists(keys.seen(member, 0)):
        r.zremrangebyscore(jobs, "-inf", int(time.time() * 1000))  # as every script does
        assert time.monotonic() < deadline, "the killed job's state did not expire"
        time.sleep(0.05)  # waiting for the server's clock to pass a TTL; not a synchronisation
    # restarted from its state dict in a new process: exactly the rest of the epoch
    before = _read(outs[2])[0]["indices"]
    rest = str(tmp_path / "rest.json")
    again = _spawn(ctx, url=server.url, job="victim", seed=22, epochs=1, out=rest,
                   resume=state, ttl_s=ttl)
    _join(again)
    after = _read(rest)[0]["indices"]
    assert len(before) == 20 and sorted(before + after) == list(range(N))
    _budget_held(server.url)


def test_a_mid_epoch_state_dict_resumes_exactly_in_a_new_process(server, no_leaks,
                                                                  tmp_path) -> None:
    ctx = mp.get_context("spawn")
    filler = ods_jobs.loader(server.url, "filler", seed=3, workers=1)  # fills the cache (20%):
    samples(filler)  # a job of its own (it leaves the group at close), here in the test process
    filler.close()
    stopped = ctx.Event()
    state, out, rest = (str(tmp_path / n) for n in ("a.pt", "a.json", "rest.json"))
    job = _spawn(ctx, url=server.url, job="a", seed=4, epochs=1, out=out, stop_after=6,
                 state_path=state, stopped=stopped, workers=1, rows=True)
    assert stopped.wait(JOIN_S)
    os.kill(job.pid, signal.SIGKILL)
    _join(job)
    first = _read(out)[0]
    assert first["cache"]["substituted"] > 0  # the saved part had swapped samples
    sd = torch.load(state)
    assert sd["delivered_by"] == "index" and sd["delivered_count"] == 24
    assert sd["schema_version"] == 3  # a headrace reading only 1-2 refuses it
    _join(_spawn(ctx, url=server.url, job="a2", seed=4, epochs=1, out=rest, resume=state,
                 rows=True))
    second = _read(rest)[0]
    assert sorted(first["indices"] + second["indices"]) == list(range(N))
    # a swapped-in sample is that sample, as computed without any cache for the same seed
    ref = hr.DataLoader(ods_jobs.pipeline(), batch_size=4, shuffle=True, num_workers=0,
                        options=hr.Options(seed=4, cache=None))
    want = samples(ref)
    for part in (first, second):
        for i, row in part["rows"].items():
            assert torch.equal(torch.tensor(row), want[int(i)].flatten()), i
    ref.close()


def test_two_live_jobs_given_one_name_count_as_two_and_are_warned(server, no_leaks,
                                                                  caplog) -> None:
    # they shared one registration and one seen key: jobs read 1, and each one's marks hid
    # the samples it stored from the other's candidates
    a, b = (ods_jobs.loader(server.url, "train", seed=s, workers=0) for s in (1, 2))
    with caplog.at_level(logging.WARNING, logger="headrace"):
        iter(b)  # b registers first
        got = samples(a)
    assert sorted(got) == list(range(N))
    assert a.stats().last.cache.jobs == 2
    said = [r.getMessage() for r in caplog.records if r.name == "headrace"]
    assert sum("ODS job name 'train' is registered by another loader" in m for m in said) == 1
    samples(b)
    assert b.stats().last.cache.jobs == 2
    a.close()
    b.close()


def test_a_job_is_offered_only_samples_cached_in_a_tier_it_looks_up(server, no_leaks) -> None:
    # one ODS group (same pipeline), other forms: a's ASK counted b's encoded entries as
    # cached, so a substituted samples it then missed (it looks up decoded only)
    def loader(seed: int, form: str):
        cache = hr.Cache(url=server.url, budget_bytes=1 << 20, ods=True, split={form: 1.0})
        return hr.DataLoader(ods_jobs.pipeline(), batch_size=4, shuffle=True,
                             options=hr.Options(seed=seed, cache=cache))

    a, b = loader(1, "decoded"), loader(2, "encoded")
    it = iter(b)
    for _ in range(3):
        next(it)  # b caches 12 samples' encoded form (and stays live)
    assert sorted(samples(a)) == list(range(N))
    c = a.stats().last.cache
    assert c.substituted == 0 and c.hits == 0 and c.inserts == N
    samples(b)
    a.close()
    b.close()


def test_an_ods_state_dict_is_refused_without_ods(server, no_leaks) -> None:
    ld = ods_jobs.loader(server.url, "solo", seed=1, workers=0)
    it = iter(ld)
    next(it)
    sd = ld.state_dict()
    assert sd["delivered_by"] == "index"
    plain = hr.DataLoader(ods_jobs.pipeline(), batch_size=4, shuffle=True,
                          options=hr.Options(seed=1, cache=None))
    with pytest.raises(hr.StateDictError, match="ODS"):
        plain.load_state_dict(sd)
    ld.close()
    plain.close()


def test_ods_stays_off_with_a_sharded_sampler_and_says_why(server, no_leaks) -> None:
    from torch.utils.data import DistributedSampler

    pipe = ods_jobs.pipeline()
    ld = hr.DataLoader(pipe, batch_size=4, num_workers=0,
                       sampler=DistributedSampler(range(N), num_replicas=2, rank=0),
                       options=hr.Options(seed=1, cache=ods_jobs.cache(server.url, "shard")))
    got = [int(r[8, 0]) for b in ld for r in b]
    assert len(got) == N // 2 and len(set(got)) == N // 2
    assert ld.stats().last.cache.jobs == 0  # no ODS request was made
    assert "ODS: off: sampler DistributedSampler" in ld.explain()
    ld.close()


def test_one_job_whose_decoded_set_fits_hits_every_epoch(server, no_leaks) -> None:
    """An exact form every live job used stays while its tier has room (no alternation of
    full and empty epochs)."""
    cache = hr.Cache(url=server.url, budget_bytes=1 << 20, ods=True, split={"decoded": 1.0})
    ld = hr.DataLoader(ods_jobs.pipeline(), batch_size=4, shuffle=True,
                       options=hr.Options(seed=1, cache=cache))
    for _ in range(3):
        samples(ld)
    e = [x.cache for x in ld.stats().epochs]
    assert e[0].inserts == N and e[1].hits == N and e[2].hits == N
    assert e[2].jobs == 1
    assert "(ODS, 1 job)" in ld.explain()
    ld.close()


def test_shared_augmented_with_ods_serves_another_jobs_samples_once(server, no_leaks) -> None:
    cache = hr.Cache(url=server.url, budget_bytes=1 << 20, ods=True, shared_augmented=True,
                     split={"augmented": 0.5, "decoded": 0.5})
    a, b = (hr.DataLoader(ods_jobs.pipeline(), batch_size=4, shuffle=True,
                          options=hr.Options(seed=s, cache=cache)) for s in (1, 2))
    iter(b)  # b joins the group before a fills the cache: two live jobs
    got_a = samples(a)
    assert a.stats().last.cache.inserts == N
    got_b = samples(b)  # every sample once, each one a's augmented sample
    c = b.stats().last.cache
    assert c.hits_by_tier["augmented"] == N and c.jobs == 2
    for i in range(N):
        assert torch.equal(got_a[i], got_b[i])  # content depends on the other job (the trade)
    assert b.cache.backend.scan_bytes() == 0  # both jobs used each: all evicted
    assert "depends on the other jobs' seeds" in b.explain()
    a.close()
    b.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_an_interrupt_while_a_batch_is_marked_gives_it_back_under_ods(server, no_leaks,
                                                                      workers) -> None:
    # the undo asked ODS again for the indices its mark had already taken (and forgotten):
    # a KeyError there, and at every later next()
    from headrace.runtime.bitmap import Bitmap
    from tests.integration.test_interrupts import interrupt_once

    ld = ods_jobs.loader(server.url, "interrupted", seed=1, workers=workers)
    it = iter(ld)
    got = [int(r[8, 0]) for r in next(it)]
    marks: list[int] = []  # the calls of Bitmap.set made by mark (ODS's own sets aside)

    def second_mark(frame, call):
        if frame.f_back.f_code.co_name == "mark" and call not in marks:
            marks.append(call)
        return len(marks) == 2

    with interrupt_once(Bitmap.set.__code__, second_mark) as fired, \
            pytest.raises(KeyboardInterrupt):
        next(it)  # interrupted in the 2nd position's mark
    assert fired["n"] == 1
    got += [int(r[8, 0]) for b in it for r in b]
    assert sorted(got) == list(range(N))
    ld.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_redis_killed_and_restarted_mid_epoch_under_ods(server, no_leaks, workers) -> None:
    from tests.integration.test_cache_redis import KillAt

    ld = ods_jobs.loader(server.url, "outage", seed=6, workers=workers)
    samples(ld)  # fills the cache
    try:
        KillAt(server, kill_at=2, start_at=7).epoch(ld)  # asserts every sample exactly once
    finally:
        if server.proc is None:
            server.start()
    c = ld.stats().last.cache
    assert c.errors > 0 and c.jobs >= 1  # requests failed meanwhile: served as asked
    assert sorted(samples(ld)) == list(range(N))  # and the next epoch runs with ODS again
    ld.close()
