"""Remote workers that start but end before returning a single sample, every one of them (a
step that kills its process on the Ray nodes only: a native library missing or broken there,
a node's memory limit): the loader stops starting more after ``starts.MAX_START_FAILURES``
in a row, as for workers whose constructor raised, and says why (docs/reliability.md).

Before, such a worker counted as started once Ray placed it, and its end as a worker lost
mid-epoch: one more was started every second for ever, each killed by its first sample."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections import Counter

import pytest

import headrace as hr
from headrace.remote.starts import MAX_START_FAILURES
from tests.helpers import ArraySource, LogSaid, ident_collate
from tests.ray_cluster.test_remote import ON_CPU_NODES

pytestmark = pytest.mark.ray

N = 24
GO = threading.Event()
"""Opens the local worker's samples (in the training process) once the test saw what it waits
for: until then only remote workers can finish samples."""


def dies_away_from(x, home: int):
    """A step that runs in process ``home`` (the training process: local worker threads), once
    ``GO`` is set, and ends any other process at once, as a native crash would."""
    if os.getpid() != home:
        os._exit(3)
    GO.wait(60)
    return x


def _loader(required: bool) -> hr.DataLoader:
    step = functools.partial(dies_away_from, home=os.getpid())
    pipe = hr.Pipeline(ArraySource(N), [hr.step(step, name="native_crash")])
    return hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                         options=hr.Options(executor="threads", max_worker_restarts=100,
                                            remote=hr.Remote(max_workers=2,
                                                             resources=ON_CPU_NODES,
                                                             required=required)))


def given_up(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and f"{MAX_START_FAILURES} in a row" in r.getMessage()]


@pytest.mark.timeout(120)
def test_workers_that_never_return_a_sample_are_given_up(ray_cluster, no_actor_leaks, caplog):
    caplog.set_level(logging.INFO, logger="headrace")
    GO.clear()
    loader = _loader(required=False)
    try:
        with LogSaid(f"{MAX_START_FAILURES} in a row") as log:
            it = iter(loader)
            assert log.said.wait(60)  # before: replaced once a second for ever
        GO.set()
        seen = Counter(int(s[0]) for b in it for s in b)
    finally:
        GO.set()
        loader.close()
    r = loader.remote
    assert seen == Counter(range(N))  # the samples the lost ones held were re-run, once
    assert r.remote_samples == 0 and r.starts.total == 0  # every actor was placed
    assert MAX_START_FAILURES <= r.lost <= MAX_START_FAILURES + 1  # one may be starting
    (last,) = given_up(caplog)
    assert "ended before returning its first sample" in last
    assert "local workers only" in last
    text = loader.explain()
    assert "could not start: it ended before returning its first sample" in text
    assert "no more are started" in text


@pytest.mark.timeout(120)
def test_workers_that_never_return_a_sample_fail_a_required_remote(ray_cluster, no_actor_leaks,
                                                                    caplog):
    caplog.set_level(logging.INFO, logger="headrace")
    GO.clear()
    loader = _loader(required=True)
    try:
        with LogSaid(f"{MAX_START_FAILURES} in a row") as log:
            it = iter(loader)
            assert log.said.wait(60)
        GO.set()
        with pytest.raises(hr.RemoteUnavailableError,
                           match="ended before returning its first sample"):
            list(it)
        del it
    finally:
        GO.set()
        loader.close()
