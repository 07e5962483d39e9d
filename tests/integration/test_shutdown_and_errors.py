"""Invariants 5 and 6: clean shutdown in every way a loop can end; errors name their place."""

import gc
import logging
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch

import headrace as hr
from tests.helpers import ArraySource, FailingDataset, IndexDataset, close_while_next_waits, jitter

pytestmark = pytest.mark.integration


def test_break_out_of_the_loop_stops_the_workers(no_leaks):
    loader = hr.DataLoader(IndexDataset(200, slow_every=1, slow_s=0.01), batch_size=4, num_workers=3)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    gc.collect()


def test_a_finished_epoch_is_freed_without_waiting_for_the_garbage_collector(no_leaks):
    # A reference cycle through the epoch's scheduler kept its batch memory (the loader's
    # buffer pool) until the collector ran: the next loader then paid fresh pages for its
    # batches (0.1-0.4 s of kernel time per epoch on the benchmark VM).
    from headrace.runtime.scheduler import Scheduler

    gc.collect()
    before = sum(isinstance(o, Scheduler) for o in gc.get_objects())
    gc.disable()
    try:
        for executor in ("processes", "threads"):
            loader = hr.DataLoader(IndexDataset(40), batch_size=4, num_workers=2,
                                   options=hr.Options(executor=executor))
            assert len([b for b in loader]) == 10
            loader.close()
            del loader
            assert sum(isinstance(o, Scheduler) for o in gc.get_objects()) == before, executor
    finally:
        gc.enable()


def test_exception_in_the_training_loop_stops_the_workers(no_leaks):
    loader = hr.DataLoader(IndexDataset(100), batch_size=4, num_workers=2)

    def train():
        for _ in loader:
            raise KeyError("training bug")

    with pytest.raises(KeyError):
        train()


def test_an_idle_scheduler_backs_off_and_anything_that_happens_resets_it():
    # an iterator left mid-epoch (a kept traceback) polled 20 times a second
    from headrace.runtime.waiter import IDLE_POLL_S, POLL_S, next_poll_s

    waits = [POLL_S]
    for _ in range(10):
        waits.append(next_poll_s(waits[-1], idle=True))
    assert waits[1] == 2 * POLL_S and waits[-1] == IDLE_POLL_S == max(waits)
    assert next_poll_s(IDLE_POLL_S, idle=False) == POLL_S


def test_a_scheduler_waiting_long_is_woken_by_everything_an_epoch_needs(monkeypatch, no_leaks):
    # with the back-off a scheduler may block a second: workers ready, results, a batch taken
    # and the end must each wake it (every wait made long here: a missed wake-up would make a
    # batch later than the loader's timeout, which raises)
    from headrace.runtime import scheduler

    monkeypatch.setattr(scheduler, "POLL_S", 60.0)
    loader = hr.DataLoader(IndexDataset(64), batch_size=4, num_workers=2, prefetch_factor=1,
                           in_order=True, timeout=20)
    got = []
    try:
        for b in loader:
            got += b.tolist()
            time.sleep(0.01)  # simulates a training step: the workers fill the cap meanwhile
        assert got == list(range(64))
    finally:
        loader.close()


def test_del_loader_with_persistent_workers(no_leaks):
    loader = hr.DataLoader(IndexDataset(20), batch_size=4, num_workers=2, persistent_workers=True)
    assert len(list(loader)) == 5
    assert len(psutil.Process().children()) >= 2
    del loader


def test_repeated_create_iterate_destroy_leaves_nothing(no_leaks):
    for _ in range(8):
        loader = hr.DataLoader(IndexDataset(12), batch_size=3, num_workers=2, shuffle=True)
        it = iter(loader)
        next(it)
        del it, loader


@pytest.mark.parametrize("workers", [0, 2])
def test_next_after_close_mid_epoch_raises_saying_what_was_left(workers, no_leaks):
    # it ended with a StopIteration after 1 of 20 batches: a training loop took that for the
    # epoch's end and went on without the other 76 samples
    loader = hr.DataLoader(IndexDataset(80), batch_size=4, num_workers=workers)
    it = iter(loader)
    next(it)
    loader.close()
    for _ in range(2):  # each next() after it, never a StopIteration
        with pytest.raises(hr.LoaderClosedError, match=re.escape(
                "closed (loader.close()) part-way through epoch 0: 1 batch(es) were delivered, "
                "and 19 of its 20 batches (76 samples) were not")) as caught:
            next(it)
    assert isinstance(caught.value, RuntimeError)
    loader.load_state_dict(loader.state_dict())  # what the message offers: the rest
    assert sorted(i for b in loader for i in b.tolist()) == list(range(4, 80))
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_next_on_an_iterator_whose_position_load_state_dict_replaced_raises(workers, no_leaks):
    # load_state_dict() closes the running epoch: its iterator ended with a StopIteration
    loader = hr.DataLoader(IndexDataset(40), batch_size=4, num_workers=workers)
    it = iter(loader)
    next(it)
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(hr.LoaderClosedError, match=re.escape(
            "load_state_dict() gave the DataLoader another position part-way through epoch 0")):
        next(it)
    assert sorted(i for b in loader for i in b.tolist()) == list(range(4, 40))
    loader.close()


def test_an_epoch_whose_scheduler_stopped_keeps_saying_so(no_leaks):
    # "scheduler thread stopped unexpectedly" once, then StopIteration: the epoch looked done
    loader = hr.DataLoader(IndexDataset(40), batch_size=4, num_workers=1)
    it = iter(loader)
    next(it)
    it.scheduler.stop()  # as if it had died: it ends, with nothing more on the queue
    it.scheduler._thread.join(30)
    assert not it.scheduler._thread.is_alive()
    while not it._out.empty():
        it._out.get_nowait()
    try:
        with pytest.raises(RuntimeError, match="scheduler thread stopped unexpectedly"):
            next(it)
        with pytest.raises(RuntimeError, match="ended on an error and cannot deliver the rest"):
            next(it)
    finally:
        loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_next_after_close_at_an_epochs_end_stops_and_a_new_iter_runs_an_epoch(workers, no_leaks):
    loader = hr.DataLoader(IndexDataset(12), batch_size=4, num_workers=workers)
    it = iter(loader)
    for _ in range(3):  # every batch, the end not seen yet
        next(it)
    loader.close()
    with pytest.raises(StopIteration):
        next(it)
    assert sorted(i for b in loader for i in b.tolist()) == list(range(12))  # after close too
    loader.close()


class Lengthless:
    """A sampler without ``__len__``: ``range(n)`` from a generator (``endless``: for ever)."""

    def __init__(self, n: int, endless: bool = False) -> None:
        self.n, self.endless = n, endless

    def __iter__(self):
        i = 0
        while self.endless or i < self.n:
            yield i % self.n
            i += 1


class LengthlessBatches(Lengthless):
    """A batch sampler without ``__len__``: ``range(n)`` in batches of 4."""

    def __iter__(self):
        yield from (list(range(i, min(i + 4, self.n))) for i in range(0, self.n, 4))


LENGTHLESS = {"sampler": lambda: {"sampler": Lengthless(12), "batch_size": 4},
              "batch_sampler": lambda: {"batch_sampler": LengthlessBatches(12)}}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(LENGTHLESS))
def test_next_after_close_at_the_end_of_a_lengthless_sampler_stops(kind, no_leaks):
    # the workers' feed read the sampler's end before the last batch was delivered: every
    # position it gave was, yet "how much was not is unknown (the sampler has no length)"
    loader = hr.DataLoader(IndexDataset(12), num_workers=2, **LENGTHLESS[kind]())
    it = iter(loader)
    got = [i for _ in range(3) for i in next(it).tolist()]  # every batch, the end not seen yet
    assert sorted(got) == list(range(12))
    loader.close()
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(it)
    assert not loader.state_dict()["in_epoch"]  # between epochs, as with a length
    assert sorted(i for b in loader for i in b.tolist()) == list(range(12))  # the next epoch
    loader.close()


@pytest.mark.timeout(60)
def test_next_after_close_before_the_end_of_a_lengthless_sampler_still_raises(no_leaks):
    # its end read by the feed, the epoch's length is known: the message says what was left
    loader = hr.DataLoader(IndexDataset(12), batch_size=4, num_workers=2, sampler=Lengthless(12))
    it = iter(loader)
    next(it)
    next(it)
    loader.close()
    with pytest.raises(hr.LoaderClosedError, match=re.escape(
            "2 batch(es) were delivered, and 4 of its 12 samples were not")):
        next(it)
    loader.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers,endless", [(0, False), (2, True)])
def test_close_where_a_lengthless_samplers_end_was_not_read_is_not_guessed(workers, endless,
                                                                           no_leaks):
    # num_workers=0 reads the sampler a batch at a time (as torch), and an endless one has no
    # end: whether a 13th sample would come is unknown, so never a StopIteration
    loader = hr.DataLoader(IndexDataset(12), batch_size=4, num_workers=workers,
                           sampler=Lengthless(12, endless))
    it = iter(loader)
    for _ in range(3):
        next(it)
    loader.close()
    with pytest.raises(hr.LoaderClosedError, match=re.escape(
            "3 batch(es) were delivered, and how much was not is unknown (the sampler has no "
            "length, or gave more than its __len__, and its end was not read yet)")):
        next(it)
    assert loader.state_dict()["in_epoch"]
    loader.close()


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_pool_closed_under_a_running_epoch_reports_no_death(executor, caplog, no_leaks):
    # what interpreter exit does to a live iterator (pool.shutdown from outside its epoch):
    # the workers exit 0 when told to, and the epoch's scheduler used to log each as "died"
    # and queue what it held to re-run (with threads: in 3 of 3 runs before the fix)
    pipe = hr.Pipeline(ArraySource(400), [hr.step(jitter, name="jitter", random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, persistent_workers=True,
                           options=hr.Options(executor=executor))
    it = iter(loader)
    next(it)
    with caplog.at_level(logging.WARNING, logger="headrace"):
        it.pool.shutdown(grace_s=0.2)
        it.scheduler._thread.join(10.0)  # it sees the pool closed, and every worker gone
    assert not it.scheduler._thread.is_alive()
    assert not [r for r in caplog.records if "died" in r.getMessage()]
    assert it.scheduler.counters.retried == 0
    del it
    loader.close()


def test_interpreter_exit_mid_epoch_leaves_no_worker(tmp_path):
    script = textwrap.dedent(
        """
        import os, sys
        sys.path.insert(0, {root!r})
        import headrace as hr
        from tests.helpers import WorkerInfoDataset
        loader = hr.DataLoader(WorkerInfoDataset(), batch_size=2, num_workers=2, collate_fn=lambda b: b)
        it = iter(loader)
        rows = next(it)
        import psutil
        print(" ".join(str(c.pid) for c in psutil.Process().children()), flush=True)
        """.format(root=str(__import__("pathlib").Path(__file__).parents[2]))
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive


def test_interpreter_exit_mid_epoch_waits_for_the_scheduler_thread():
    # The exit stopped the pools and left the scheduler thread to see it and return: a daemon
    # thread still running when the interpreter finalises is ended wherever it is, and inside
    # torch's C++ code that aborts the process (exit code 134, "terminate called without an
    # active exception": seen once). Here the script ends while the thread is busy in a tick
    # listener (simulated work); a hook registered before headrace's runs after them and looks
    # for it.
    script = textwrap.dedent(
        """
        import atexit, sys, threading, time
        sys.path.insert(0, {root!r})

        def after():
            alive = [t.name for t in threading.enumerate() if t.name == "headrace-scheduler"]
            print("alive after the exit hooks:", alive, flush=True)

        atexit.register(after)  # runs after headrace's own hooks (registered later)
        import headrace as hr
        from tests.helpers import IndexDataset
        loader = hr.DataLoader(IndexDataset(64), batch_size=4, num_workers=2,
                               persistent_workers=True)
        busy = threading.Event()

        def tick(_):
            busy.set()
            time.sleep(1.0)  # simulated work: the scheduler's pass (a large batch's assembly)

        loader.monitor.tick_listeners.append(tick)
        it = iter(loader)
        next(it)
        assert busy.wait(30)  # the script ends while the scheduler thread is in its pass
        """.format(root=str(__import__("pathlib").Path(__file__).parents[2]))
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "alive after the exit hooks: []" in out.stdout, (out.stdout, out.stderr)


def test_the_process_exits_while_a_collate_fn_call_is_still_running():
    # the collate threads were joined at exit (ThreadPoolExecutor's): a collate_fn blocked on
    # a later batch kept the script from ending (torch's workers, where it runs, are killed)
    script = textwrap.dedent(
        """
        import sys, threading
        sys.path.insert(0, {root!r})
        import torch
        import headrace as hr
        from tests.helpers import IndexDataset

        in_call = threading.Event()

        def collate(batch):
            if int(batch[0]) >= 16:  # batch 8 on: blocks (bounded: 60 s)
                in_call.set()
                threading.Event().wait(60)
            return torch.utils.data.default_collate(batch)

        loader = hr.DataLoader(IndexDataset(32), batch_size=2, num_workers=2, in_order=True,
                               collate_fn=collate)
        for i, b in enumerate(loader):  # the first 4 are collated in next(), then on the thread
            if i == 4:
                in_call.wait(60)  # the collate thread is inside the blocking call
                break
        print("left the loop", flush=True)
        """.format(root=str(__import__("pathlib").Path(__file__).parents[2]))
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=45)  # under the call's 60 s: it did not wait for it
    assert out.returncode == 0 and out.stdout == "left the loop\n", out.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_training_process_leaves_no_cache_in_shared_memory(sig):
    # SLURM preemption, `docker stop`: no finaliser runs in the training process; its workers
    # see it gone and remove the cache directory it held (up to the cache budget of /dev/shm)
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, {root!r})
        import headrace as hr
        from tests.helpers import ArraySource
        loader = hr.DataLoader(hr.Pipeline(ArraySource(4000), [lambda x: x + 1]), batch_size=4,
                               num_workers=2, shuffle=True)
        for epoch in range(1000):  # killed long before the end
            for i, b in enumerate(loader):
                if epoch == 1 and i == 0:
                    print(loader.cache.backend.path, flush=True)
        """.format(root=str(__import__("pathlib").Path(__file__).parents[2]))
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        path = proc.stdout.readline().strip()
        assert path.startswith("/dev/shm/headrace-cache-") and os.path.isdir(path)
        workers = psutil.Process(proc.pid).children()
        proc.send_signal(sig)
        proc.wait(timeout=30)
        psutil.wait_procs(workers, timeout=30)  # they exit within a poll of seeing it gone
        assert not os.path.exists(path)
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.mark.timeout(120)
def test_workers_exit_when_the_killed_training_process_is_not_reaped():
    # a launcher that reads the training process's output to the end before it reaps it
    # (subprocess.run(capture_output=True), communicate()) keeps it a zombie: the workers
    # took the zombie for alive and held the output pipes open, so the launcher never
    # returned (torch's workers exit: their parent changed)
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, {root!r})
        import headrace as hr
        from tests.helpers import ArraySource
        loader = hr.DataLoader(hr.Pipeline(ArraySource(4000), [lambda x: x + 1]), batch_size=4,
                               num_workers=2)
        for epoch in range(1000):  # killed long before the end
            for i, b in enumerate(loader):
                if epoch == 1 and i == 0:
                    print("running", flush=True)
        """.format(root=str(__import__("pathlib").Path(__file__).parents[2]))
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "running"
        trainer = psutil.Process(proc.pid)
        workers = trainer.children()
        assert workers
        proc.send_signal(signal.SIGKILL)  # and not reaped until the workers are gone
        _, alive = psutil.wait_procs(workers, timeout=20)
        assert not alive, "workers outlived the killed (unreaped) training process"
        assert trainer.status() == psutil.STATUS_ZOMBIE  # it was not reaped meanwhile
        assert proc.stdout.read() == ""  # the output pipe closed: a reader returns
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _running(p: psutil.Process) -> bool:
    """Not exited (an exited child not yet reaped by init is a zombie: exited)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("stuck_in", ["worker_init_fn", "step"])
def test_workers_stuck_in_user_code_exit_when_the_training_process_is_killed(stuck_in):
    """A worker whose ``worker_init_fn`` or step does not return (here: waits up to 60 s)
    cannot see the training process go from its loop; its watchdog thread ends it within a
    second or so of a SIGKILL of the training process, with its sibling, and the cache's
    directory on /dev/shm goes with them."""
    script = textwrap.dedent(
        """
        import multiprocessing, os, sys, threading
        sys.path.insert(0, {root!r})
        import headrace as hr
        from tests.helpers import ArraySource

        in_init = multiprocessing.Event()  # the workers fork with it

        def stuck(i=None):
            print("stuck", os.getpid(), flush=True)  # the same stdout as the training process
            threading.Event().wait(60)  # user code that does not return (bounded: 60 s)

        def init(worker_id):
            if {stuck_in!r} == "worker_init_fn" and worker_id == 1:
                in_init.set()
                stuck()

        def step(x):
            if {stuck_in!r} == "step" and int(x[0]) == 5:
                stuck()
            return x

        loader = hr.DataLoader(hr.Pipeline(ArraySource(64), [step]), batch_size=4,
                               num_workers=2, worker_init_fn=init)
        it = iter(loader)
        print(loader.cache.backend.path, flush=True)  # the default cache, on /dev/shm
        for b in it:  # worker 0 alone could finish the epoch before worker 1 starts
            if {stuck_in!r} == "worker_init_fn":
                in_init.wait(60)
        """.format(root=str(__import__("pathlib").Path(__file__).parents[2]),
                   stuck_in=stuck_in)
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    workers: list[psutil.Process] = []
    try:
        # two lines, in either order: the cache's directory (training process), "stuck <pid>"
        # (the worker, in the stuck code: its 60 s bound the wait if it never gets there)
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        cache_dir = next(x for x in lines if not x.startswith("stuck"))
        stuck_pid = int(next(x for x in lines if x.startswith("stuck")).split()[1])
        assert cache_dir.startswith("/dev/shm/headrace-cache-") and os.path.isdir(cache_dir)
        workers = psutil.Process(proc.pid).children()
        assert stuck_pid in [w.pid for w in workers] and len(workers) == 2
        proc.kill()
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(workers, timeout=15)  # not the stuck code's 60 s
        alive = [w for w in alive if _running(w)]
        assert not alive, f"{[w.pid for w in alive]} outlived the training process"
        assert not os.path.exists(cache_dir)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        for w in workers:  # a failed check leaves none behind
            try:
                w.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.parametrize("workers", [0, 2])
def test_failing_step_raises_with_index_step_and_traceback(workers, no_leaks):
    loader = hr.DataLoader(FailingDataset(20, {13}), batch_size=4, num_workers=workers)
    with pytest.raises(hr.StepError) as ei:
        list(loader)
    loader.close()  # the epoch list() left (its traceback keeps it alive until then)
    e = ei.value
    assert isinstance(e, ValueError)  # `except ValueError` keeps working, as with torch
    assert e.index == 13 and e.step == "load"
    assert "corrupt sample 13" in str(e) and "__getitem__" in e.remote_traceback


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_policy_drops_and_counts_failing_samples(workers, no_leaks):
    loader = hr.DataLoader(FailingDataset(20, {3, 13}), batch_size=4, num_workers=workers,
                           options=hr.Options(on_error="skip"))
    got = sorted(i for b in loader for i in b.tolist())
    assert got == sorted(set(range(20)) - {3, 13})
    assert loader.stats().last.skipped_samples == 2


def _drain(it):
    """Batches and errors of one epoch, as a training loop that catches errors sees them."""
    out, errors = [], []
    for _ in range(100):  # bounded: a loop that never ends is a failure, not a hang
        try:
            out.append(next(it).tolist())
        except StopIteration:
            return out, errors
        except hr.StepError as e:
            errors.append(e.index)
    raise AssertionError("the epoch did not end")


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_raises_for_its_batch_and_the_epoch_goes_on_like_torch(workers, no_leaks):
    ds = FailingDataset(40, {13})
    torch_batches, torch_errors = [], 0
    it = iter(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers))
    for _ in range(100):
        try:
            torch_batches.append(next(it).tolist())
        except StopIteration:
            break
        except ValueError:
            torch_errors += 1
    loader = hr.DataLoader(ds, batch_size=4, num_workers=workers, in_order=True)
    got, errors = _drain(iter(loader))
    assert (got, len(errors)) == (torch_batches, torch_errors) == (got, 1)
    assert len(got) == 9 and errors == [13]
    assert loader.stats().last.failed_samples == 1


def test_sample_aware_batching_raises_once_and_delivers_every_other_sample(no_leaks):
    loader = hr.DataLoader(FailingDataset(40, {13, 27}), batch_size=4, num_workers=2,
                           shuffle=True)
    got, errors = _drain(iter(loader))
    assert sorted(errors) == [13, 27]
    assert sorted(i for b in got for i in b) == sorted(set(range(40)) - {13, 27})


def test_an_epoch_per_step_keeps_a_bounded_history(monkeypatch, no_leaks):
    # next(iter(loader)) once per step: every iter() is an epoch, and each epoch's stats were
    # kept for the loader's life (about 2 KB each, without end)
    from headrace.telemetry import stats

    monkeypatch.setattr(stats, "EPOCHS_KEPT", 3)
    loader = hr.DataLoader(IndexDataset(8), batch_size=2, num_workers=0,  # a cache: asked for
                           options=hr.Options(cache=hr.Cache(shared_augmented=True)))
    try:
        firsts = [next(iter(loader)).tolist() for _ in range(10)]
        assert firsts == [[0, 1]] * 10
        assert len(loader.monitor.epochs) == 3 and len(loader.stats().epochs) == 3
        assert len(loader.cache.closed_epochs) == 3  # kept aligned with the monitor's
        assert "epoch 9:" in loader.explain()
    finally:
        loader.close()


class Flag:
    """Garbage in a reference cycle whose ``__del__`` records the process that ran it."""

    def __init__(self, path):
        self.path, self.me = path, self

    def __del__(self):
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


class CollectsGarbage(torch.utils.data.Dataset):
    """Each sample runs a full garbage collection in its worker, as a busy worker's would."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        gc.collect()
        return i


def test_the_training_processs_garbage_is_never_finalised_in_a_worker(tmp_path, no_leaks):
    # a __del__ of the training process's (a temporary directory's cleanup, another loader's
    # shutdown) ran in whichever forked worker's collector reached it first
    marker = tmp_path / "deleted_by"
    loader = hr.DataLoader(CollectsGarbage(), batch_size=2, num_workers=2)
    try:
        Flag(marker)  # unreachable at once, collected only by a collector
        assert sorted(i for b in loader for i in b.tolist()) == list(range(8))
    finally:
        loader.close()
    gc.collect()
    assert marker.read_text().split() == [str(os.getpid())]


def test_objects_the_user_froze_stay_frozen_after_workers_fork(no_leaks):
    # the pool froze everything around each fork and unfroze everything after it, taking
    # the user's own gc.freeze() back with it
    mine = [[]]  # a container the collector tracks
    gc.freeze()
    try:
        assert not any(o is mine for o in gc.get_objects())  # frozen: outside its generations
        loader = hr.DataLoader(IndexDataset(8), batch_size=2, num_workers=2)
        try:
            assert sorted(i for b in loader for i in b.tolist()) == list(range(8))
        finally:
            loader.close()
        assert not any(o is mine for o in gc.get_objects())
        assert gc.isenabled()
    finally:
        gc.unfreeze()


class CollectorOn(torch.utils.data.Dataset):
    """Each sample says whether its worker's garbage collector is on."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return int(gc.isenabled())


def test_two_loaders_forking_at_once_leave_every_worker_collecting(no_leaks):
    # the collector is off in the training process while a worker forks: two loaders forking
    # from two threads read it off from each other, and a worker ran with it off for good
    off = []

    def run():
        loader = hr.DataLoader(CollectorOn(), batch_size=4, num_workers=2)
        try:
            for _ in range(8):  # an epoch forks its workers anew
                off.extend(v for b in loader for v in b.tolist() if not v)
        finally:
            loader.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert off == [] and gc.isenabled()


class _SlowSamples(torch.utils.data.Dataset):
    """Samples that take work; ``under_way`` is set once a worker reaches sample 20."""

    def __init__(self) -> None:
        self.under_way = multiprocessing.get_context("fork").Event()

    def __len__(self):
        return 400

    def __getitem__(self, i):
        if i == 20:
            self.under_way.set()
        time.sleep(0.05)  # simulated work: the training thread waits for each batch
        return i


def test_close_from_another_thread_while_next_waits_raises_loader_closed(no_leaks):
    # the waiting next() saw the scheduler thread gone and blamed it: "headrace scheduler
    # thread stopped unexpectedly" (a review)
    data = _SlowSamples()
    loader = hr.DataLoader(data, batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    with pytest.raises(hr.LoaderClosedError):
        close_while_next_waits(loader, it, data.under_way, 200)  # bounded: the epoch's batches
