"""Fault injection: killed workers, hung steps, corrupt inputs. Nothing lost, nothing duplicated."""

import gc
import io
import os
import re
import signal
import weakref
from collections import Counter

import numpy as np
import psutil
import pytest
import torch
from PIL import Image

import headrace as hr
from headrace.runtime.deaths import exit_code
from tests.helpers import (
    FailingDataset,
    HangingDataset,
    IndexDataset,
    KillerDataset,
    check_finite,
    decode_jpeg,
)

pytestmark = pytest.mark.integration


def flat(loader):
    return [i for b in loader for i in b.tolist()]


def worker_pids(it):
    """This epoch's live worker processes (not every child of the test process: an earlier
    test's workers may still be waiting for the garbage collector, the session's redis-server
    is a child too, and a worker killed a moment ago may still be a zombie)."""
    out = []
    for w in list(it.pool.workers.values()):
        try:
            if psutil.Process(w.process.pid).status() != psutil.STATUS_ZOMBIE:
                out.append(w.process.pid)
        except (psutil.NoSuchProcess, ValueError):
            pass
    return out


@pytest.mark.parametrize("in_order", [False, True])
def test_sigkill_a_worker_mid_epoch(in_order, no_leaks):
    loader = hr.DataLoader(IndexDataset(60, slow_every=1, slow_s=0.01), batch_size=4, num_workers=2,
                           shuffle=True, in_order=in_order)
    got, it = [], iter(loader)
    for k, b in enumerate(it):
        got += b.tolist()
        if k == 2:
            os.kill(worker_pids(it)[0], signal.SIGKILL)  # as the OOM killer would
    assert Counter(got) == Counter(range(60))
    st = loader.stats()
    assert st.worker_restarts >= 1


def test_kill_every_worker_several_times_in_a_row(no_leaks):
    # A sample running at every kill would be taken for the culprit after max_worker_restarts
    # deaths; kills from outside are not its fault, so this test allows more.
    loader = hr.DataLoader(IndexDataset(80, slow_every=1, slow_s=0.005), batch_size=4, num_workers=3,
                           shuffle=True, options=hr.Options(max_worker_restarts=5))
    got, kills, it = [], 0, iter(loader)
    for k, b in enumerate(it):
        got += b.tolist()
        if k in (1, 2, 3, 6):
            for pid in worker_pids(it):  # the workers alive now (replacements may be starting)
                os.kill(pid, signal.SIGKILL)
                kills += 1
    assert Counter(got) == Counter(range(80))
    # a round that lands after the last sample was dispatched is the next epoch's to handle
    assert kills >= 6 and loader.stats().worker_restarts >= kills - 3


def test_a_sample_that_always_kills_its_worker_is_named(no_leaks):
    loader = hr.DataLoader(KillerDataset(20, {7}), batch_size=4, num_workers=2)
    with pytest.raises(hr.WorkerDiedError, match="sample index 7"):
        list(loader)


class _Indices:
    def __len__(self) -> int:
        return 24

    def load(self, i: int) -> int:
        return i


def _dies_on_13(i: int) -> torch.Tensor:
    if i == 13 and torch.utils.data.get_worker_info() is not None:
        os.kill(os.getpid(), signal.SIGKILL)  # as a native crash or the OOM killer would
    return torch.tensor(i)


def test_a_worker_dying_in_a_step_names_the_step_the_workers_and_the_signal(no_leaks, caplog):
    """Invariant 6: the error names its place. It said "sample index 13 ... (last exit code
    -9); the sample likely crashes or exhausts memory", and the warnings "worker 0 died (exit
    code -9); re-running 2 sample(s)": no step, no workers, a signal as a bare number."""
    pipe = hr.Pipeline(source=_Indices(), steps=[hr.step(_dies_on_13, name="decode")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, options=hr.Options(cache=None))
    with pytest.raises(hr.WorkerDiedError) as ei:
        list(loader)
    text = str(ei.value)
    assert "sample index 13 was being processed in step 'decode'" in text, text
    assert "killed by SIGKILL" in text and "exit code" not in text, text
    # the two slots it died in: the second attempt may go to slot 0's replacement when that
    # one asks first (a loaded machine: "workers 0, 0", as right)
    assert re.search(r"\(workers [01], [01];", text), text
    warnings = [r.getMessage() for r in caplog.records if "died (" in r.getMessage()]
    assert warnings and all("in step 'decode' on sample index 13" in w for w in warnings), warnings
    assert all("indices [" in w and "13" in w.split("indices [")[1] for w in warnings), warnings


def _closes_then_dies(conn, go) -> None:
    conn.close()  # the result pipe's EOF, as a dying worker's descriptors close
    go.wait()  # its exit comes after: once the parent saw the EOF
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_workers_exit_code_is_read_once_it_can_be_collected():
    """A worker's result pipe reaches EOF before its parent can collect its exit status: the
    death was seen there and its exit code read at once, ``None`` (a loaded CI run: "the last
    exit code unknown: code in the step ended the process" for a SIGKILLed worker)."""
    ctx = torch.multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    go = ctx.Event()
    proc = ctx.Process(target=_closes_then_dies, args=(writer, go), daemon=True)
    proc.start()
    writer.close()
    with pytest.raises(EOFError):
        reader.recv()
    go.set()  # the child is alive until now: its exit code cannot be there yet
    assert exit_code(proc) == -signal.SIGKILL
    reader.close()


def test_an_epoch_left_after_a_worker_death_error_has_stopped_its_workers(no_leaks):
    """Clean shutdown: once the training loop's ``except`` block dropped the error, the epoch
    iterator is finalised in the training thread and its workers are reaped. The scheduler
    thread held the last reference to the error (whose traceback holds the iterator's frames)
    in some runs: the iterator was finalised there, joining the replacement worker while the
    training loop went on (5 of 20 loaders left a child process: a zombie the test's no_leaks
    fixture caught once). With the collector off, a reference cycle keeping it would show too."""
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    gc.disable()  # reference counting alone: finalised at the except block's end, or never
    try:
        for _ in range(10):
            pipe = hr.Pipeline(source=_Indices(), steps=[hr.step(_dies_on_13, name="decode")])
            loader = hr.DataLoader(pipe, batch_size=4, num_workers=1,
                                   options=hr.Options(cache=None))
            it = iter(loader)
            alive = weakref.ref(it)
            with pytest.raises(hr.WorkerDiedError):
                for _ in it:
                    pass
            del it
            assert alive() is None, "the epoch iterator outlived the error"
            left = {c.pid for c in me.children()} - before
            assert not left, f"worker processes left after the except block: {sorted(left)}"
    finally:
        gc.enable()


def _exits_on_5(i: int) -> torch.Tensor:
    if i == 5:
        raise SystemExit(3)  # a library calling sys.exit(3)
    return torch.tensor(i)


def _interrupts_on_5(i: int) -> torch.Tensor:
    if i == 5:
        raise KeyboardInterrupt("raised by the step itself")
    return torch.tensor(i)


@pytest.mark.parametrize(("fn", "raised"), [(_exits_on_5, "SystemExit"),
                                             (_interrupts_on_5, "KeyboardInterrupt")])
def test_sys_exit_from_a_step_in_a_worker_is_that_samples_step_error(fn, raised, no_leaks):
    """A step raising SystemExit or KeyboardInterrupt in a worker process (no signal: workers
    ignore SIGINT) is that sample's StepError with its traceback, as an error is. It ended the
    worker: the sample was re-run on a second one, which died too, and the WorkerDiedError
    blamed a crash or memory, with the traceback lost."""
    pipe = hr.Pipeline(source=_Indices(), steps=[hr.step(fn, name="decode")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, options=hr.Options(cache=None))
    with pytest.raises(hr.StepError) as ei:
        list(loader)
    e = ei.value
    assert (e.index, e.step, e.cause_type) == (5, "decode", raised)
    assert e.worker in (0, 1) and "raise " in e.remote_traceback, e.remote_traceback
    assert loader.stats().worker_restarts == 0
    skip = hr.DataLoader(pipe, batch_size=4, num_workers=2,
                         options=hr.Options(cache=None, on_error="skip"))
    assert Counter(flat(skip)) == Counter(set(range(24)) - {5})


def test_a_sample_that_kills_workers_is_skipped_under_skip_policy(no_leaks):
    loader = hr.DataLoader(KillerDataset(20, {7}), batch_size=4, num_workers=2,
                           options=hr.Options(on_error="skip"))
    assert Counter(flat(loader)) == Counter(set(range(20)) - {7})
    e = loader.stats().last
    assert e.skipped_samples == 1 and e.retried_samples >= 1


def test_hung_step_is_replaced_retried_once_then_fails_per_policy(no_leaks):
    opts = hr.Options(sample_timeout_s=0.5)
    loader = hr.DataLoader(HangingDataset(12, {5}), batch_size=3, num_workers=2, options=opts)
    with pytest.raises(TimeoutError) as ei:  # a StepError that is also a TimeoutError
        list(loader)
    assert ei.value.index == 5 and ei.value.step == "load"
    skip = hr.DataLoader(HangingDataset(12, {5}), batch_size=3, num_workers=2,
                         options=hr.Options(sample_timeout_s=0.5, on_error="skip"))
    assert Counter(flat(skip)) == Counter(set(range(12)) - {5})
    assert skip.stats().worker_restarts >= 2  # first attempt and the retry elsewhere


def test_sample_timeout_without_workers_warns_that_it_has_no_effect(no_leaks):
    # a step hung for ever with num_workers=0, the option silently ignored
    loader = hr.DataLoader(IndexDataset(4), batch_size=2, options=hr.Options(sample_timeout_s=1))
    with pytest.warns(UserWarning, match=r"sample_timeout_s=1\) has no effect with num_workers=0"):
        it = iter(loader)
    assert flat(it) == [0, 1, 2, 3]


class JpegSource:
    def __init__(self, blobs):
        self.blobs = blobs

    def __len__(self):
        return len(self.blobs)

    def load(self, i):
        return self.blobs[i]


def _jpeg(size, value):
    buf = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def test_truncated_jpeg_names_the_sample_and_the_decode_step(no_leaks):
    blobs = [_jpeg(16, i) for i in range(10)]
    blobs[6] = blobs[6][: len(blobs[6]) // 3]
    pipe = hr.Pipeline(JpegSource(blobs), [hr.step(decode_jpeg, kind="decode")])
    loader = hr.DataLoader(pipe, batch_size=2, num_workers=2)
    with pytest.raises(hr.StepError) as ei:
        list(loader)
    loader.close()  # the epoch list() left (its traceback keeps it alive until then)
    assert ei.value.index == 6 and ei.value.step == "decode_jpeg"
    skipping = hr.DataLoader(pipe, batch_size=2, num_workers=2, options=hr.Options(on_error="skip"))
    assert sum(len(b) for b in skipping) == 9


def test_wrong_shape_names_the_samples_of_the_batch(no_leaks):
    blobs = [_jpeg(16, i) for i in range(8)]
    blobs[3] = _jpeg(20, 3)
    pipe = hr.Pipeline(JpegSource(blobs), [hr.step(decode_jpeg, kind="decode")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, in_order=True)
    with pytest.raises(hr.StepError) as ei:
        list(loader)
    loader.close()  # the epoch list() left (its traceback keeps it alive until then)
    assert ei.value.step == "collate_fn" and "3" in str(ei.value) and "shape" in str(ei.value)
    # on_error="skip" drops samples, not batches: not advised for a batch (it changed nothing)
    assert "on_error='skip') to drop" not in str(ei.value)
    assert "drops failing samples, not batches" in str(ei.value)


def test_nan_caught_by_a_validation_step(no_leaks):
    class Src:
        def __len__(self):
            return 10

        def load(self, i):
            return np.array([np.nan if i == 4 else float(i)])

    pipe = hr.Pipeline(Src(), [hr.step(check_finite)])
    loader = hr.DataLoader(pipe, batch_size=5, num_workers=2)
    with pytest.raises(hr.StepError) as ei:
        list(loader)  # the error raises for its batch; the epoch would go on, list() stops
    loader.close()  # the epoch list() left (its traceback keeps it alive until then)
    assert ei.value.index == 4 and ei.value.step == "check_finite" and isinstance(ei.value, ValueError)


SHM_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
import torch, headrace as hr

class Big(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.ones(20_000_000)  # 80 MB: over a ring's quarter, through /dev/shm (1 MB)

try:
    list(hr.DataLoader(Big(), batch_size=2, num_workers=1))
    print("no error")
except hr.StepError as e:
    print("index", e.index, "step", e.step)
    print(e)
"""


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tiny /dev/shm in a mount namespace")
def test_exhausted_shared_memory_gives_a_clear_error(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "shm.py"
    script.write_text(SHM_SCRIPT.format(root=str(Path(__file__).parents[2])))
    # A private mount namespace with a 1 MB /dev/shm: real exhaustion, invisible to the host.
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} {script}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "index 0 step transport" in out.stdout
    assert "Shared memory (/dev/shm) is exhausted" in out.stdout


@pytest.mark.parametrize("in_order", [None, False])
def test_a_failing_sample_in_process_loses_no_batch_mate_when_batches_are_regrouped(in_order):
    # num_workers=0 dropped the failing sample's sampler batch whole (torch's batches) while
    # explain() said the batching was sample-aware, as it is with workers (a fuzz hunt)
    loader = hr.DataLoader(FailingDataset(13, {10}), batch_size=7, shuffle=True, num_workers=0,
                           in_order=in_order, generator=torch.Generator().manual_seed(1))
    it, got, errors = iter(loader), [], 0
    for _ in range(10):  # bounded: 2 batches and 1 error expected
        try:
            got += next(it).tolist()
        except StopIteration:
            break
        except ValueError:
            errors += 1
    assert errors == 1 and sorted(got) == [i for i in range(13) if i != 10]
    assert "sample-aware" in loader.explain()


@pytest.mark.parametrize(("n", "bad", "bound"), [(10, -1, 2), (20, 5, 3)])
def test_a_bound_in_flight_under_a_batch_does_not_hang_regrouped_batches(n, bad, bound):
    # finished samples wait in flight for their batch: under batch_size of them the last short
    # batch (or one a skipped sample left short) never filled, and the sampler was never read
    # on (a fuzz hunt: next() blocked for ever)
    import threading

    loader = hr.DataLoader(FailingDataset(n, {bad}), batch_size=4, shuffle=True, num_workers=2,
                           options=hr.Options(max_in_flight=bound, on_error="skip"))
    got: list[int] = []
    run = threading.Thread(target=lambda: got.extend(i for b in loader for i in b.tolist()),
                           daemon=True)
    run.start()
    run.join(60)
    try:
        assert not run.is_alive(), "the epoch hung"
        assert sorted(got) == [i for i in range(n) if i != bad]
    finally:
        loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_drop_last_drops_a_regrouped_batch_a_skipped_sample_left_short(workers):
    # num_workers=0 sent the last regrouped batch out short where workers drop and count it
    # in order (in_order=False regroups): sample 7 is among the 20 positions drop_last keeps
    loader = hr.DataLoader(FailingDataset(23, {7}), batch_size=4, in_order=False,
                           drop_last=True, num_workers=workers,
                           options=hr.Options(on_error="skip"))
    try:
        sizes = [len(b) for b in loader]
    finally:
        loader.close()
    assert sizes == [4, 4, 4, 4] and loader.stats().last.dropped_samples == 3
