"""A remote worker's proxy thread (in the training process) that dies of an exception of its
own, not of Ray's: it is counted lost and replaced like one whose actor died, and the samples
it held are delivered exactly once (docs/design.md, "A proxy that fails").

Before, only a ``RayError`` counted the worker lost: a proxy ending on any other exception was
neither counted nor replaced, so the loader ran on with one remote worker fewer for the rest
of the pool's life.
"""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.remote import proxy_calls
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
