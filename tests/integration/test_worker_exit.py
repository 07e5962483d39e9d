"""A worker process takes tasks already waiting in its pipe before it sends the cheap samples
it kept, and sends them before it exits when told to (a real pool, no scheduler). Sample 1
waits on a lock the test holds, so every message is in the pipe before the worker's queue
runs dry."""

import fcntl
import multiprocessing
import time

import numpy as np
import pytest
import torch.utils.data as tud

import headrace as hr
from headrace.runtime.pool import WorkerPool
from headrace.runtime.worker import Task
from tests.helpers import wait_at_gate

pytestmark = pytest.mark.integration

CTX = multiprocessing.get_context("fork")


class GatedSource:
    """``load(i)``: a small array; sample 1 first waits for a shared lock on ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 8

    def load(self, i: int) -> np.ndarray:
        if i == 1:
            wait_at_gate(self.path)
        return np.full(4, i)


def until_closed(conn, timeout_s: float = 30.0) -> list[tuple]:
    """Every message on a worker's result pipe until the worker closes it (bounded)."""
    got: list[tuple] = []
    deadline = time.monotonic() + timeout_s
    while True:
        assert time.monotonic() < deadline, f"the worker did not exit; got {got}"
        if conn.poll(0.05):
            try:
                got.append(conn.recv())
            except EOFError:
                return got


def run_gated(tmp_path, batches: list[list[int]], retire: bool) -> list[tuple]:
    """Send ``batches`` of tasks (kept for up to 60 s of work) while sample 1 is held, then
    ask the worker to exit, open the gate, and return what came back after "ready"."""
    gate = tmp_path / "gate"
    gate.touch()
    pool = WorkerPool(hr.Pipeline(GatedSource(str(gate)), []), None, CTX, None, 0, 1,
                      profile=False)
    with open(gate, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pool.start(1)
            w = pool.workers[0]
            for tids in batches:
                w.send_many([Task(t, t, 0, None, 0, 0, False) for t in tids], hold_s=60.0)
            if retire:
                pool.retire(w)
            else:
                w.send_exit()
            fcntl.flock(lock, fcntl.LOCK_UN)
            got = until_closed(w.conn)
            w.process.join(10)
            assert w.process.exitcode == 0
        finally:
            pool.shutdown()
    assert got[0][0] == "ready"
    return got[1:]


def test_a_retired_worker_sends_what_it_kept_before_it_exits(tmp_path):
    got = run_gated(tmp_path, [[1, 2, 3]], retire=True)
    assert [m[0] for m in got] == ["many"]
    assert [(m[0], m[1]) for m in got[0][1]] == [("done", 1), ("done", 2), ("done", 3)]


def test_tasks_waiting_in_the_pipe_are_taken_before_kept_samples_are_sent(tmp_path):
    # sending 1 and 2 as soon as the queue ran dry, with 3 and 4 waiting, made two messages
    got = run_gated(tmp_path, [[1, 2], [3, 4]], retire=False)
    assert [m[0] for m in got] == ["many"]
    assert [m[1] for m in got[0][1]] == [1, 2, 3, 4]


def test_a_forkserver_child_knows_the_training_process_from_its_fork_server():
    # a fork server is a forkserver worker's parent, never the training process: workers took
    # their first idle wait for the training process's death, exited, and removed the live
    # cache on their way out (every epoch's cache gone, a worker replaced per idle gap)
    import os
    import subprocess
    import sys

    from headrace.runtime.parent import parent_gone

    with multiprocessing.get_context("forkserver").Pool(1) as pool:
        assert pool.apply(os.getppid) != os.getpid()  # the fork server
        assert pool.apply(parent_gone, (os.getpid(),)) is False
        gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a pid now gone
        gone.wait(timeout=30)
        assert pool.apply(parent_gone, (gone.pid,)) is True


def test_forkserver_workers_leave_the_cache_alone_across_epochs(no_leaks):
    import os

    from tests.helpers import ArraySource, check_finite

    loader = hr.DataLoader(hr.Pipeline(ArraySource(64), [check_finite]), batch_size=8,
                           num_workers=2, multiprocessing_context="forkserver",
                           persistent_workers=True)
    try:
        data = None
        for _ in range(2):
            assert sorted(float(v) for b in loader for v in b.flatten()) == [float(i) for i in range(64)]
            shard = loader.cache.backend.shards[0].path  # the cache exists from the first epoch
            data = data or os.stat(os.path.join(shard, "data.mdb")).st_ino
        assert os.stat(os.path.join(shard, "data.mdb")).st_ino == data
        assert loader.stats().worker_restarts == 0
    finally:
        loader.close()


@pytest.mark.timeout(120)
def test_a_process_forked_by_user_code_leaves_the_loader_alone_when_it_exits():
    # the child's exit ran headrace's exit hook and the loader's finalisers on the parent's
    # pool and cache (exit messages down the workers' pipes, the cache's directory removed),
    # and multiprocessing's exit hook sent SIGTERM to the workers it inherited as children
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = str(Path(__file__).parents[2])
    script = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {root!r})
        import headrace as hr
        from tests.helpers import ArraySource, check_finite
        loader = hr.DataLoader(hr.Pipeline(ArraySource(64), [check_finite]), batch_size=8,
                               num_workers=2, persistent_workers=True)
        first = sorted(float(v) for b in loader for v in b.flatten())
        path = loader.cache.backend.path
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a helper process that ends through the interpreter
        os.waitpid(pid, 0)
        second = sorted(float(v) for b in loader for v in b.flatten())
        s = loader.stats()
        print(first == second == [float(i) for i in range(64)], s.worker_restarts,
              os.path.isdir(path), loader.cache is not None and not loader.cache.dropped,
              flush=True)
        loader.close()
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=90)
    assert out.returncode == 0, out.stderr
    exact, restarts, cache_kept, cache_on = out.stdout.split()
    assert exact == "True" and restarts == "0", out.stderr
    assert cache_kept == cache_on == "True", out.stderr  # the loader did not drop its cache



class GatedAfter8(tud.Dataset):
    """Samples 8 and later wait at the gate file (held by the test, bounded by its timeout)."""

    def __init__(self, gate: str) -> None:
        self.gate = gate

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        if i >= 8:
            wait_at_gate(self.gate)
        return i


@pytest.mark.timeout(120)
def test_workers_left_by_a_ctrl_c_during_shutdown_go_with_the_next_pool(tmp_path, no_leaks):
    # a Ctrl-C caught while an epoch closed (a notebook's interrupted cell) cut the pool's
    # shutdown short: the pool was marked closed, no later close asked again, and its workers,
    # busy with samples, stayed (until the interpreter exited), more at each such Ctrl-C
    import psutil

    from tests.helpers import IndexDataset

    gate = tmp_path / "gate"
    gate.write_text("")
    with open(gate) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        loader = hr.DataLoader(GatedAfter8(str(gate)), batch_size=4, num_workers=2,
                               in_order=True)
        it = iter(loader)
        assert next(it).tolist() == [0, 1, 2, 3]
        pool = it.pool
        workers = [psutil.Process(h.process.pid) for h in pool.workers.values()]
        dispose, calls = pool._dispose, []

        def interrupted(h, *a, **kw):  # the Ctrl-C lands in the first worker's join
            calls.append(h.slot)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return dispose(h, *a, **kw)

        pool._dispose = interrupted
        with pytest.raises(KeyboardInterrupt):
            it.close()
        assert pool.closed and all(p.is_running() for p in workers)  # left behind, waiting
        del it
        other = hr.DataLoader(IndexDataset(8), batch_size=4, num_workers=1)
        assert sum(len(b) for b in other) == 8  # a new pool sweeps what was left
        _, alive = psutil.wait_procs(workers, timeout=20)  # still at the gate: never on
        assert not alive and len(calls) == 3  # their own (the first again, then the second)
        other.close()
        loader.close()
