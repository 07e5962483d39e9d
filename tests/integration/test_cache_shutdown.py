"""The memory cache closed while a worker thread still runs a sample (``cache/lmdb_envs.py``).

A loader deleted mid-epoch (what an interrupted run does) gives up on a worker thread inside a
step: nothing can stop a thread. Its sample then ends and stores its form in a cache that was
closed under it. That is the shutdown, not a failure of the cache."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

import headrace as hr

pytestmark = pytest.mark.integration
HELD = 5
"""The sample whose worker thread is inside a step when the loader is deleted."""


class Source:
    def __len__(self) -> int:
        return 12

    def load(self, i: int) -> np.ndarray:
        return np.full((64,), float(i), np.float32)


def decode(x: np.ndarray) -> np.ndarray:
    time.sleep(0.002)  # simulated work: a form is stored when its steps cost more than a copy
    return x * 2


class Gate:
    """Holds sample ``HELD`` in its worker thread until ``go``; ``inside`` says it is there."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.go = threading.Event()
        self.thread: threading.Thread | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if int(x[0]) == 2 * HELD and not self.go.is_set():
            self.thread = threading.current_thread()
            self.inside.set()
            assert self.go.wait(60)
        return x


def test_a_thread_that_outlives_its_loader_does_not_report_the_closed_cache(caplog, no_leaks):
    # 1 run in 15 of a hunt's interrupted runs logged "the cache failed (Error: Attempt to
    # operate on closed/deleted/dropped object.)" and counted a cache error: the loader closed
    # the LMDB environment that an abandoned worker thread used next
    gate = Gate()
    pipe = hr.Pipeline(Source(), [hr.step(decode, kind="decode"), hr.step(gate, name="gate")])
    loader = hr.DataLoader(pipe, batch_size=2, num_workers=2, persistent_workers=True,
                           options=hr.Options(executor="threads", profile_store=False,
                                              cache=hr.Cache(budget_bytes=1 << 20)))
    session = loader.cache
    it = iter(loader)
    next(it)
    assert gate.inside.wait(60)  # sample HELD's thread is inside the gate step
    with caplog.at_level(logging.WARNING, logger="headrace"):
        loader.close()  # as del does: its workers given up on, then its cache removed
        assert gate.thread is not None and gate.thread.is_alive()
        gate.go.set()  # the sample ends, stores its decoded form, and the thread exits
        gate.thread.join(60)
        assert not gate.thread.is_alive()
    assert session.counters.totals()["inserts"] > 0  # forms were stored before the close
    assert session.counters.totals()["errors"] == 0
    assert not [r for r in caplog.records if "cache failed" in r.getMessage()]
