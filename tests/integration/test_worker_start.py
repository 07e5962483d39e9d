"""A fresh pool's workers find their first samples waiting when they have started, as torch's
do; a worker started later (the scaler's, a replacement) gets work once it says it is ready.
And the workers the pool forks run OpenBLAS with one thread without starting its thread pool."""

import multiprocessing
import os
import time

import numpy as np
import pytest
import torch.utils.data as tud

import headrace as hr
from headrace.runtime.batcher import Batcher
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.dispatch import DEPTH
from headrace.runtime.native_threads import (
    blas_limited,
    blas_threads,
    limit_in_worker,
    resolved_for_fork,
)
from headrace.runtime.pool import WorkerPool
from headrace.runtime.scheduler import Scheduler
from headrace.runtime.work import EpochSpec
from tests.helpers import ArraySource, IndexDataset

pytestmark = pytest.mark.integration

CTX = multiprocessing.get_context("fork")


class Hooks:
    """What dispatch asks the monitor: no timeout learned yet, a deep queue allowed."""

    def slow_threshold_s(self) -> float:
        return float("inf")

    def queue_depth(self) -> int:
        return 8

    def hold_s(self, depth: int) -> float:
        return 0.001

    def on_tick(self, sched) -> None:
        pass


def test_the_pools_first_workers_get_work_before_they_are_ready_later_ones_after():
    pipe = hr.Pipeline(ArraySource(64), [])
    pool = WorkerPool(pipe, None, CTX, None, 0, 3, profile=False)
    spec = EpochSpec(epoch=0, base_seed=0, groups=iter([[i] for i in range(64)]),
                     auto_collation=True, batcher=Batcher("regroup", 1), collate=lambda b: b,
                     pin=None, max_in_flight=64, handoff=False, slow_lane_share=0.25,
                     on_error="raise", max_restarts=2, delivered=Bitmap(64), total_positions=64)
    sched = Scheduler(pool, spec, Hooks(), None)  # its thread is not started: nobody reads
    try:                                          # the workers' "ready" messages
        pool.start(2)
        first = list(pool.workers.values())
        assert [(w.eager, w.ready) for w in first] == [(True, False)] * 2
        sched.dispatcher.dispatch()
        # the usual two each while they start, not the deep queue ready workers may get
        assert [len(w.assigned) for w in first] == [DEPTH] * 2
        later = pool.add_worker()  # as the scaler adds one mid-epoch
        assert later is not None and not later.eager
        sched.dispatcher.dispatch()
        assert later.assigned == {}  # its samples would wait for its start: it waits for "ready"
        later.ready = True
        sched.dispatcher.dispatch()
        assert len(later.assigned) == 8  # ready: the deep queue
    finally:
        sched.stop()
        pool.shutdown()


def _report_limited(conn) -> None:
    limit_in_worker(1)
    a = np.ones((300, 300))
    product = float((a @ a)[0, 0])  # a BLAS call after the limit: runs, on this thread
    conn.send((sorted(set(blas_threads().values())), len(os.listdir("/proc/self/task")), product))


@pytest.mark.parametrize("resolved", [True, False], ids=["forked-inside", "looks-itself"])
def test_a_forked_worker_limits_openblas_with_or_without_resolved_setters(resolved):
    assert blas_threads(), "no OpenBLAS found among this process's libraries"
    with blas_limited(2):
        reader, writer = CTX.Pipe(duplex=False)
        proc = CTX.Process(target=_report_limited, args=(writer,))
        if resolved:
            with resolved_for_fork():
                proc.start()
        else:
            proc.start()
        try:
            assert reader.poll(30), "the child did not report"
            counts, threads, product = reader.recv()
            assert counts == [1] and product == 300.0
            assert threads == 1  # OpenBLAS's pool, stopped by the fork, was not started again
        finally:
            proc.join(30)
        assert set(blas_threads().values()) == {2}  # the training process keeps its count


def _dies(worker_id: int) -> None:
    os._exit(3)  # as a segfault in an import, or the OOM killer at start-up


class _DiesOnce:
    """A ``worker_init_fn`` that ends worker 1's process the first time only (a flag file)."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __call__(self, worker_id: int) -> None:
        if worker_id == 1 and not os.path.exists(self.flag):
            open(self.flag, "w").close()
            os._exit(3)


def test_a_worker_whose_start_always_kills_it_raises_instead_of_restarting_for_ever(no_leaks):
    """It was replaced again and again (16 forks in a 0.2 s epoch, one per death, for as long
    as the epoch ran); torch raises at the first death. The only worker: no other can end the
    epoch first, so the error is the only way out (before, the loader's timeout was)."""
    loader = hr.DataLoader(IndexDataset(64), batch_size=4, num_workers=1, worker_init_fn=_dies,
                           timeout=20)
    try:
        with pytest.raises(hr.WorkerDiedError, match="worker 0 died 3 times in a row while "
                                                     r"starting.*exit code 3"):
            for _ in loader:
                pass
    finally:
        loader.close()


def test_a_worker_that_dies_once_while_starting_is_replaced(tmp_path, no_leaks):
    loader = hr.DataLoader(IndexDataset(64), batch_size=4, num_workers=2,
                           worker_init_fn=_DiesOnce(str(tmp_path / "died")), timeout=60)
    try:
        assert sorted(i for b in loader for i in b.tolist()) == list(range(64))
        # it held its first samples from its start, so the epoch could not end before it died;
        # they ran elsewhere or in its replacement
        assert (tmp_path / "died").exists()
    finally:
        loader.close()


class _Counted(IndexDataset):
    """``IndexDataset`` whose samples take 5 ms of simulated work; ``all_read`` is set once
    ``n`` reads were made (in any process: the count is shared)."""

    def __init__(self, n: int, all_read, reads) -> None:
        super().__init__(n)
        self.all_read, self.reads = all_read, reads

    def __getitem__(self, i: int) -> int:
        time.sleep(0.005)  # simulated work
        with self.reads.get_lock():
            self.reads.value += 1
            if self.reads.value >= self.n:
                self.all_read.set()
        return i


class _LastFailsLate:
    """``worker_init_fn``: worker 2 fails once ``later`` is set (a batch was collated, or every
    sample was read without it), or after 30 s."""

    def __init__(self, later) -> None:
        self.later = later

    def __call__(self, worker_id: int) -> None:
        if worker_id == 2:
            self.later.wait(30)
            raise ValueError("cannot open the database")


class _CollateSays:
    """A ``collate_fn`` that sets ``collated`` (a batch went out), then collates as torch."""

    def __init__(self, collated) -> None:
        self.collated = collated

    def __call__(self, batch):
        self.collated.set()
        return tud.default_collate(batch)


@pytest.mark.parametrize("in_order", [True, None])
def test_a_worker_init_fn_failing_in_one_worker_raises_before_any_batch(in_order, no_leaks):
    # The failing worker's error was handled when the scheduler got round to it: other
    # workers' batches went out first, in 4 runs of 20 the whole epoch (torch raises at that
    # worker's first batch, every run). Worker 2 fails only once a batch went out, or once
    # the other workers read every sample: before, the training loop got batches first.
    for _ in range(5):
        later, reads = CTX.Event(), CTX.Value("i", 0)
        loader = hr.DataLoader(_Counted(8, later, reads), batch_size=2, num_workers=3,
                               in_order=in_order, worker_init_fn=_LastFailsLate(later),
                               collate_fn=_CollateSays(later), multiprocessing_context=CTX,
                               timeout=60)
        got = []
        try:
            with pytest.raises(ValueError, match="worker 2 failed to start"):
                for b in loader:
                    got.append(b.tolist())
        finally:
            loader.close()
        assert got == []


class _FailsIn:
    """``worker_init_fn`` that raises in the workers of ``slots``, counting those calls in
    ``calls`` (shared by every process)."""

    def __init__(self, slots: set[int], calls) -> None:
        self.slots, self.calls = slots, calls

    def __call__(self, worker_id: int) -> None:
        if worker_id in self.slots:
            with self.calls.get_lock():
                self.calls.value += 1
            raise ValueError(f"cannot open shard {worker_id}")


def test_persistent_workers_raise_a_failed_start_once_then_go_on_without_it(caplog, no_leaks):
    # A worker whose worker_init_fn failed was replaced; its replacement ran it again, failed
    # again, and that error came in whichever later epoch read it: before its first batch,
    # after its last one, or not at all (a hunt's find). torch raises once; its persistent
    # workers serve every later epoch. Workers 1 and 2 fail here: the first epoch raises
    # worker 1's error (the lowest slot: torch's order) before any batch, the next three run
    # every sample on worker 0, and neither failed slot starts again. Several loaders: the
    # order of the failing workers' messages varies from run to run, the outcome must not.
    for _ in range(3):
        caplog.clear()
        calls = CTX.Value("i", 0)
        loader = hr.DataLoader(IndexDataset(12), batch_size=2, num_workers=3,
                               persistent_workers=True, worker_init_fn=_FailsIn({1, 2}, calls),
                               multiprocessing_context=CTX, timeout=60)
        got = []
        try:
            with pytest.raises(ValueError, match="worker 1 failed to start"):
                for b in loader:
                    got.append(b.tolist())
            assert got == []
            for _ in range(3):
                assert sorted(i for b in loader for i in b.tolist()) == list(range(12))
            assert sorted(loader._pool.workers) == [0]
            assert calls.value == 2  # once in each failing slot, never in a replacement
            said = [r.getMessage() for r in caplog.records if r.name == "headrace"]
            assert [m for m in said if "go on without it" in m] == [
                f"headrace worker {i}: its worker_init_fn (or dataset setup) failed; the "
                "persistent workers go on without it" for i in (1, 2)]  # once, at epoch 2
            assert not [m for m in said if "died" in m]
        finally:
            loader.close()
