"""Worker processes fork on the training thread only (``runtime/forks.py``): a child forked by
the scheduler thread inherited the locks the training thread held at that moment (torch's CPU
generator's, inside ``torch.randn``) and hung in its first ``torch.manual_seed``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

import headrace as hr
from headrace.planner.placement import PlacementConfig
from headrace.remote.autoplace import PlacementController
from headrace.runtime import epoch as epoch_module
from headrace.runtime.pool import WorkerPool
from tests.helpers import ArraySource, IndexDataset

pytestmark = pytest.mark.integration

_forks: list[int] | None = None  # the threads that forked, while a test records them


def _record_fork() -> None:
    if _forks is not None:
        _forks.append(threading.get_ident())


os.register_at_fork(before=_record_fork)


class _Recorded:
    """Record which threads fork inside the ``with`` block (``forked_by``)."""

    def __enter__(self) -> list[int]:
        global _forks
        _forks = []
        return _forks

    def __exit__(self, *exc: object) -> None:
        global _forks
        _forks = None


class PidDataset(torch.utils.data.Dataset):
    """``(index, pid of the process that made it)``, 2 ms a sample (simulated reading)."""

    def __len__(self) -> int:
        return 800  # ~0.8 s on 2 workers after the kill: time for the replacement to serve

    def __getitem__(self, i: int) -> tuple[int, int]:
        time.sleep(0.002)
        return i, os.getpid()


def _draw_for(seconds: float) -> None:
    """The training step: CPU random draws, holding torch's CPU generator lock (bounded)."""
    end = time.monotonic() + seconds
    for _ in range(1000):
        torch.randn(1_000_000)
        if time.monotonic() > end:
            return


def test_a_worker_replaced_while_the_training_thread_draws_forks_there_and_serves(no_leaks):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the draws hold the generator's lock on this thread alone
    loader = hr.DataLoader(PidDataset(), batch_size=8, num_workers=2, persistent_workers=True)
    got, pids, killed = [], Counter(), None
    try:
        with _Recorded() as forked_by:
            it = iter(loader)
            for k, (index, pid) in enumerate(it):
                got += index.tolist()
                pids.update(pid.tolist())
                if k == 2:
                    killed = it.pool.workers[0].process.pid
                    os.kill(killed, signal.SIGKILL)  # replaced while the next step draws
                _draw_for(0.3 if k == 2 else 0.0)
        replacement = loader._pool.workers[0].process.pid
    finally:
        loader.close()
        torch.set_num_threads(threads)
    assert Counter(got) == Counter(range(800))
    assert forked_by and set(forked_by) == {threading.get_ident()}, "forked off the training thread"
    assert replacement != killed and pids[replacement] > 0  # it started, and served samples
    assert loader.stats().worker_restarts == 1


def test_the_scalers_workers_fork_on_the_training_thread(no_leaks):
    opts = hr.Options(autoscale=hr.AutoscaleConfig(initial=1, max_workers=3, interval_s=0.05))
    loader = hr.DataLoader(PidDataset(), batch_size=8, num_workers="auto", options=opts)
    with _Recorded() as forked_by:
        got = [i for index, _ in loader for i in index.tolist()]
    assert Counter(got) == Counter(range(800))
    assert max(n for _, n in loader.stats().workers_timeline) > 1  # it asked for more
    assert len(forked_by) > 1 and set(forked_by) == {threading.get_ident()}


def test_requests_wait_for_the_training_thread_and_keep_their_order(no_leaks):
    pool = WorkerPool(hr.Pipeline(ArraySource(8), []), None, multiprocessing.get_context("fork"),
                      None, 0, 3, profile=False)
    woken: list[int] = []
    pool.requests.on_asked = lambda: woken.append(len(pool.requests))
    try:
        pool.start(1)
        asked = threading.Thread(target=lambda: [pool.request_worker(), pool.request_worker(),
                                                 pool.request_worker()])
        asked.start()
        asked.join()
        assert woken == [1, 2] and len(pool.workers) == 1  # the third slot was asked for
        dead = pool.workers[0]
        assert pool.replace(dead) and 0 not in pool.workers and len(pool.requests) == 3
        added: list[list[int]] = []
        pool.start_requested(on_added=lambda: added.append(sorted(pool.workers)))
        # the replacement first, in its slot (the scaler's two were asked before the death)
        assert added == [[0], [0, 1], [0, 1, 2]]
        assert len(pool.requests) == 0 and not pool.request_worker()  # every slot taken
    finally:
        pool.shutdown()


def test_autoplacement_counts_and_withdraws_local_workers_not_yet_forked(no_leaks):
    """AutoPlacement's local moves (``remote/autoplace.py``, on the scheduler thread) ask for
    workers; a count lowered before they were forked withdraws them instead of leaving more
    workers than the policy chose."""
    pool = WorkerPool(hr.Pipeline(ArraySource(8), []), None, multiprocessing.get_context("fork"),
                      None, 0, 4, profile=False)
    ctl = PlacementController(SimpleNamespace(target=0), PlacementConfig(max_remote=2, max_local=4),
                              local=1, batch_size=4)
    try:
        pool.start(1)
        ctl._set_local(pool, 3)
        assert len(pool.workers) == 1 and len(pool.requests) == 2  # for the training thread
        ctl._set_local(pool, 3)
        assert len(pool.requests) == 2  # asked already: not again
        ctl._set_local(pool, 2)
        assert len(pool.workers) == 1 and len(pool.requests) == 1  # one withdrawn, none retired
        pool.start_requested()
        assert len(pool.workers) == 2 and not any(w.retiring for w in pool.workers.values())
    finally:
        pool.shutdown()


def test_wake_ups_of_a_waiting_next_do_not_push_the_loaders_timeout_back(monkeypatch, no_leaks):
    """Each "start" (or "feed") item that woke a waiting ``next()`` restarted ``timeout``: a
    loader whose workers hang, while the scaler asks for workers, waited on and on. Here each
    wake-up comes as soon as ``next()`` waits again, and moves the epoch's clock on 0.2 s: with
    a 0.5 s timeout the third one is past it."""
    loader = hr.DataLoader(IndexDataset(8, slow_every=1, slow_s=30.0), batch_size=4,
                           num_workers=1, timeout=0.5)
    it = iter(loader)
    ahead = [0.0]  # seconds the epoch's clock runs ahead of the real one
    monkeypatch.setattr(epoch_module, "time", SimpleNamespace(
        monotonic=lambda: time.monotonic() + ahead[0], perf_counter=time.perf_counter,
        thread_time=time.thread_time))
    waiting, stop = threading.Event(), threading.Event()
    get = it._out.get

    def get_and_say_so(block=True, timeout=None):
        if block:  # the blocking wait inside next() (get_nowait calls get(block=False))
            waiting.set()
        return get(block, timeout)

    it._out.get = get_and_say_so
    woken = []

    def wake_up() -> None:  # as the scheduler thread asking for a worker, at most 20 times
        while len(woken) < 20 and waiting.wait(10) and not stop.is_set():
            waiting.clear()
            ahead[0] += 0.2
            woken.append(ahead[0])
            it._out.put(("start", None, None))

    waker = threading.Thread(target=wake_up)
    waker.start()
    try:
        with pytest.raises(RuntimeError, match="timed out after 0.5 seconds"):
            next(it)
        assert len(woken) <= 3  # 0.6 s in: one deadline for the whole wait (20 before)
    finally:
        stop.set()
        waiting.set()
        waker.join()
        loader.close()
