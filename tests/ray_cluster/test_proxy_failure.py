"""A remote worker's proxy thread (in the training process) that dies of an exception of its
own, not of Ray's: it is counted lost and replaced like one whose actor died, and the samples
it held are delivered exactly once (docs/design.md, "Remote workers are one more kind of
worker").

Before, only a ``RayError`` counted the worker lost: a proxy ending on any other exception was
neither counted nor replaced, so the loader ran on with one remote worker fewer for the rest
of the pool's life. The attempt such a death counts is the sample's the proxy was handling
(it went to the one queued behind it), and the replacement waits until the scheduler has
handled the death (a tick in between found none needed, for good).
"""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.remote import proxy_calls
from headrace.remote.replacing import Replacements
from tests.helpers import ident_collate
from tests.ray_cluster.test_remote import (
    ON_CPU_NODES,
    by_index,
    pipeline,
    remote_ready,
    wait_ready,
)

pytestmark = pytest.mark.ray

N = 160


class FailOnce:
    """``proxy_calls.unpack`` (the proxy's own handling of an actor's result) raising once,
    in the first proxy thread that calls it: a bug in the proxy, not in the user's code."""

    def __init__(self) -> None:
        self.real = proxy_calls.unpack
        self.fired = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, x):
        with self._lock:
            first = not self.fired.is_set()
            self.fired.set()
        if first:
            raise RuntimeError("a bug in the proxy (injected by the test)")
        return self.real(x)


def _loader(remote: bool) -> hr.DataLoader:
    opts = hr.Options(seed=7, remote=hr.Remote(max_workers=2, resources=ON_CPU_NODES)
                      if remote else None)
    return hr.DataLoader(pipeline(N), batch_size=4, shuffle=True, num_workers=1,
                         collate_fn=ident_collate, options=opts)


@pytest.mark.timeout(300)
def test_a_proxy_dying_of_its_own_exception_is_counted_and_replaced(ray_cluster, no_actor_leaks,
                                                                   monkeypatch):
    ref_loader = _loader(remote=False)
    try:
        expected = by_index(list(ref_loader))
    finally:
        ref_loader.close()
    loader = _loader(remote=True)
    fault = FailOnce()
    monkeypatch.setattr(proxy_calls, "unpack", fault)  # the first remote result kills its proxy
    got: dict[int, dict] = {}
    seen: Counter[int] = Counter()
    try:
        it = iter(loader)
        wait_ready(it, 2)
        for batch in it:
            seen.update(s["i"] for s in batch)
            got.update(by_index([batch]))
            if fault.fired.is_set():
                break
        assert fault.fired.is_set(), "no remote result came back"
        sched = it.scheduler
        with sched.readiness:  # woken at each "ready" the scheduler handles
            replaced = sched.readiness.wait_for(
                lambda: loader.remote.placed_total >= 3 and remote_ready(it, 2), 60)
        for batch in it:
            seen.update(s["i"] for s in batch)
            got.update(by_index([batch]))
    finally:
        loader.close()
    assert loader.remote.lost == 1, "the proxy that failed was not counted lost"
    assert replaced, "the proxy that failed was not replaced"
    assert seen == Counter(range(N))
    for i, s in expected.items():
        assert torch.equal(got[i]["t"], s["t"]) and np.array_equal(got[i]["a"], s["a"])
        assert got[i]["n"] == s["n"]


class FailOn:
    """``proxy_calls.unpack`` raising on every result of a sample whose index is 5 modulo 8:
    such a sample fails every proxy that gets its result back (``hit``: those it did)."""

    def __init__(self) -> None:
        self.real = proxy_calls.unpack
        self.hit: set[int] = set()

    def __call__(self, x):
        if isinstance(x, dict) and x.get("i", 0) % 8 == 5:
            self.hit.add(x["i"])
            raise RuntimeError("a bug in the proxy on this sample (injected by the test)")
        return self.real(x)


@pytest.mark.timeout(300)
def test_the_sample_a_proxy_failed_on_is_the_one_counted(ray_cluster, no_actor_leaks,
                                                          monkeypatch):
    # One death is one attempt, and it is the sample the proxy was handling that counts it
    # (max_worker_restarts=1: failed, here skipped, at its first). Before, the attempt went to
    # the sample queued behind it at the actor (progress.tid already named it): an innocent
    # sample was skipped, and the one that fails every proxy was retried.
    fault = FailOn()
    monkeypatch.setattr(proxy_calls, "unpack", fault)
    loader = hr.DataLoader(pipeline(N), batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=7, on_error="skip", max_worker_restarts=1,
                                              remote=hr.Remote(max_workers=2,
                                                               resources=ON_CPU_NODES)))
    try:
        it = iter(loader)
        wait_ready(it, 2)
        seen = Counter(s["i"] for b in it for s in b)
    finally:
        loader.close()
    assert fault.hit, "no sample failed a proxy"
    assert loader.remote.lost >= 1
    assert max(seen.values()) == 1
    assert set(range(N)) - set(seen) == fault.hit


def test_an_end_is_answered_once_its_worker_has_left_the_pool():
    # A proxy reports its worker's end from its own thread, before the scheduler has handled
    # it: asked in between, the session saw the ended worker still in the pool, found no
    # replacement needed and answered that end for good (the first test above, once in three
    # runs: "not replaced"). The same on the session's clock, without Ray or threads.
    r = Replacements(every_s=1.0)
    r.ended(3)
    assert not r.due(1, [2, 3], now=10.0)  # slot 3 still holds the worker that ended
    assert r.due(1, [2], now=10.0)  # its end handled: one replacement
    r.started(3)
    assert not r.due(1, [2, 3], now=20.0)  # that end is answered
    r.ended(2)
    assert not r.due(2, [3], now=10.5)  # within every_s of the last one
    assert r.due(2, [3], now=11.0)
