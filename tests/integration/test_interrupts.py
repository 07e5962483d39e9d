"""A Ctrl-C inside ``next()``, caught, and the same iterator read on: nothing is lost.

A signal's exception lands between two bytecodes of whatever the training thread runs. Here a
trace function raises ``KeyboardInterrupt`` once at a chosen line (deterministic: the places a
real SIGINT can land, without waiting for one to). Before, a batch taken from the queue and
interrupted before ``next()`` returned it was lost for the rest of the epoch, which then
ended without a word; with ``num_workers=0`` an interrupted sample's batch-mates were lost.
"""

from __future__ import annotations

import inspect
import queue
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType, FrameType
from typing import Any

import pytest
import torch

import headrace as hr
from headrace.runtime.bitmap import Bitmap
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration

N = 40


@contextmanager
def interrupt_once(code: CodeType, when: Callable[[FrameType, int], bool]) -> Iterator[dict]:
    """Raise ``KeyboardInterrupt`` at the first line event of ``code`` (in this thread) for
    which ``when(frame, call)`` is true (``call``: 1 for the first call of ``code``, ...);
    ``fired["n"]``: how many times it did (at most once)."""
    fired = {"n": 0}
    calls = {"n": 0}

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None
        calls["n"] += 1
        call = calls["n"]

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line" and not fired["n"] and when(frame, call):
                fired["n"] += 1
                raise KeyboardInterrupt("simulated Ctrl-C")
            return local

        return local

    sys.settrace(trace)
    try:
        yield fired
    finally:
        sys.settrace(None)


def read_on(it: Iterator[Any]) -> tuple[list[int], int, BaseException | None]:
    """Every index the iterator yields, reading on after each KeyboardInterrupt; the number of
    interrupts; the error that ended it (None: StopIteration)."""
    got: list[int] = []
    interrupts = 0
    while True:
        try:
            b = next(it)
        except StopIteration:
            return got, interrupts, None
        except KeyboardInterrupt:
            interrupts += 1
            continue
        except RuntimeError as e:
            return got, interrupts, e
        got.extend(b.tolist())


def batches_and_errors(it: Iterator[Any], caught: type[BaseException]) -> list[Any]:
    """Each batch (as a list) and, in its place, the name of each ``caught`` error, until
    ``StopIteration``; at most 20 ``next()`` calls (an error raised for ever fails the test)."""
    events: list[Any] = []
    for _ in range(20):
        try:
            events.append(next(it).tolist())
        except StopIteration:
            return events
        except caught:
            events.append(caught.__name__)
    raise AssertionError(f"no StopIteration after 20 next(): {events[:8]}...")


def nth_call(n: int) -> Callable[[FrameType, int], bool]:
    """At the first line of the ``n``-th call."""
    return lambda frame, call: call == n


@pytest.mark.parametrize("workers", [0, 2])
def test_an_interrupt_while_a_batch_is_marked_gives_it_back(workers):
    """Interrupted after part of its positions were marked delivered: the batch is not
    delivered (for state_dict() either) and the next next() returns it."""
    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=workers, shuffle=True,
                           generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    first = next(it).tolist()
    # interrupted in the 2nd position's mark
    with interrupt_once(Bitmap.set.__code__, nth_call(2)) as fired, \
            pytest.raises(KeyboardInterrupt):
        next(it)
    assert fired["n"] == 1
    state = loader.state_dict()  # the interrupted batch is not delivered
    got, _, err = read_on(it)
    assert err is None and Counter(first + got) == Counter(range(N))
    resumed = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=workers, shuffle=True,
                            generator=torch.Generator().manual_seed(0))
    resumed.load_state_dict(state)
    assert Counter(first + read_on(iter(resumed))[0]) == Counter(range(N))


def _drawing_collate(batch: list[int]) -> torch.Tensor:
    torch.rand(())  # draws random numbers: collated in the training loop ("deferred")
    return torch.tensor(batch)


def test_an_interrupt_inside_a_collate_fn_in_the_training_loop_runs_it_again():
    calls = {"n": 0}

    def collate(batch: list[int]) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated Ctrl-C")
        return _drawing_collate(batch)

    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=2, collate_fn=collate)
    got, interrupts, err = read_on(iter(loader))
    assert interrupts == 1 and err is None
    assert Counter(got) == Counter(range(N))


class _InterruptedOnce(IndexDataset):
    """``__getitem__(at)`` is interrupted the first time (a Ctrl-C while the sample loads)."""

    def __init__(self, n: int, at: int) -> None:
        super().__init__(n)
        self.at = at
        self.fired = False

    def __getitem__(self, i: int) -> int:
        if i == self.at and not self.fired:
            self.fired = True
            raise KeyboardInterrupt("simulated Ctrl-C")
        return i


@pytest.mark.parametrize("in_order", [True, False])
def test_an_interrupt_while_a_sample_loads_in_process_loses_no_batch_mate(in_order):
    loader = hr.DataLoader(_InterruptedOnce(N, at=9), batch_size=4, num_workers=0,
                           in_order=in_order)
    got, interrupts, err = read_on(iter(loader))
    assert interrupts == 1 and err is None
    assert Counter(got) == Counter(range(N))


class Abort(BaseException):
    """A user's own ``BaseException`` (not an ``Exception``): raised by sample 5 every time."""


class _AbortsAtFive(IndexDataset):
    def __getitem__(self, i: int) -> int:
        if i == 5:
            raise Abort(i)
        return i


@pytest.mark.parametrize("in_order", [True, False])
def test_a_sample_raising_a_base_exception_every_time_fails_on_its_rerun(in_order):
    # taken for an interrupt, the sample ran again at every next(), raising again: the
    # iterator could never go past it (torch raises it once and goes on)
    loader = hr.DataLoader(_AbortsAtFive(20), batch_size=4, num_workers=0, in_order=in_order)
    it = iter(loader)
    events = batches_and_errors(it, Abort)
    # run once again, as after a Ctrl-C, then failed; its batch-mates go with it in torch's
    # batches, and wait for the next batch when batches are regrouped
    after = ([[8, 9, 10, 11], [12, 13, 14, 15], [16, 17, 18, 19]] if in_order else
             [[4, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16], [17, 18, 19]])
    assert events == [[0, 1, 2, 3], "Abort", "Abort", *after]
    stats = it.stats()
    assert stats.failed_samples == 1 and stats.samples == (16 if in_order else 19)


class _GivesUpAt:
    """A ``collate_fn`` raising ``exc`` (not an ``Exception``) on the batch holding ``at``
    (the first ``times`` times; ``None``: every time); ``thread``: the name of the thread it
    raised on."""

    def __init__(self, exc: type[BaseException], at: int, times: int | None = None) -> None:
        self.exc, self.at, self.times, self.thread = exc, at, times, ""

    def __call__(self, samples: list[int]) -> torch.Tensor:
        if self.at in samples and (self.times is None or self.times > 0):
            self.times = None if self.times is None else self.times - 1
            self.thread = threading.current_thread().name
            raise self.exc(f"the collate_fn gives up at {self.at}")
        return torch.tensor(samples)


def first_and_errors(it: Iterator[Any], *caught: type[BaseException]) -> list[Any]:
    """Each batch's first index and, in its place, each ``caught`` error itself, until
    ``StopIteration``; at most 30 ``next()`` calls."""
    events: list[Any] = []
    for _ in range(30):
        try:
            events.append(next(it)[0].item())
        except StopIteration:
            return events
        except caught as e:
            events.append(e)
    raise AssertionError(f"no StopIteration after 30 next(): {events[:8]}...")


# batch 15 (60..63) of 20: past the four batches watched in the training loop and the ones
# queued meanwhile (runtime/collate_rng.py), so on a collate thread
AT = 60
BATCHES_BUT_AT = list(range(0, AT, 4)) + list(range(AT + 4, 80, 4))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("exc", [Abort, SystemExit, KeyboardInterrupt])
def test_a_collate_fn_raising_a_base_exception_on_a_collate_thread_raises_it_once(exc, no_leaks):
    # taken for an interrupt, the batch was dropped uncounted, and the epoch ended with a
    # RuntimeError blaming a Ctrl-C for a lost batch; torch raises it once and goes on
    collate = _GivesUpAt(exc, AT)
    it = iter(hr.DataLoader(IndexDataset(80), batch_size=4, num_workers=2, in_order=True,
                            collate_fn=collate))
    events = first_and_errors(it, exc)
    assert collate.thread.startswith("headrace-collate")
    raised = [e for e in events if isinstance(e, BaseException)]
    assert len(raised) == 1 and type(raised[0]) is exc  # itself: no `except Exception` takes it
    assert events.index(raised[0]) == len(range(0, AT, 4))  # in its batch's place
    assert raised[0].__notes__ == [  # type: ignore[attr-defined]
        f"headrace: raised in step 'collate_fn' (the loader's collate_fn) on the batch of "
        f"sample indices [{AT}, {AT + 1}, {AT + 2}, {AT + 3}]"]
    assert [e for e in events if not isinstance(e, BaseException)] == BATCHES_BUT_AT
    stats = it.stats()
    assert stats.finished and stats.samples == 76


@pytest.mark.timeout(60)
def test_a_ctrl_c_while_waiting_for_a_collate_thread_that_raised_leaves_its_error_next(no_leaks):
    """A Ctrl-C in ``Future.result`` once the call had raised is an interrupt, not the
    collate_fn's outcome: the batch stays for the next ``next()``, which raises the
    collate_fn's own exception (taken for its outcome, the batch was lost)."""
    from concurrent.futures import Future

    collate = _GivesUpAt(Abort, AT)
    it = iter(hr.DataLoader(IndexDataset(80), batch_size=4, num_workers=2, in_order=True,
                            collate_fn=collate))

    def raised(frame: FrameType, call: int) -> bool:
        f = frame.f_locals["self"]
        return bool(f.done() and f.exception() is not None)

    with interrupt_once(Future.result.__code__, raised) as fired:
        events = first_and_errors(it, KeyboardInterrupt, Abort)
    assert fired["n"] == 1 and collate.thread.startswith("headrace-collate")
    at = len(range(0, AT, 4))
    assert [type(e) for e in events[at:at + 2]] == [KeyboardInterrupt, Abort]
    assert events[:at] + events[at + 2:] == BATCHES_BUT_AT
    assert it.stats().finished


def kinds(events: list[Any]) -> list[Any]:
    """:func:`first_and_errors`' events, each error as its type."""
    return [type(e) if isinstance(e, BaseException) else e for e in events]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("exc", [Abort, SystemExit])
def test_a_collate_fn_in_the_loop_raising_a_base_exception_every_time_fails_on_its_rerun(
        exc, workers, no_leaks):
    # in the training loop (num_workers=0, or one of the batches watched there: collate_rng.py)
    # it was taken for an interrupt and run again at every next(), raising again: the
    # iterator could never go past it (torch raises it once and goes on)
    collate = _GivesUpAt(exc, 4)
    it = iter(hr.DataLoader(IndexDataset(20), batch_size=4, num_workers=workers, in_order=True,
                            collate_fn=collate))
    events = first_and_errors(it, exc)
    assert collate.thread == threading.main_thread().name
    assert kinds(events) == [0, exc, exc, 8, 12, 16]  # run once again, as after a Ctrl-C
    assert "step 'collate_fn'" in events[2].__notes__[0]
    assert "[4, 5, 6, 7]" in events[2].__notes__[0]
    stats = it.stats()
    assert stats.finished and stats.samples == 16


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_fn_in_the_loop_interrupted_twice_still_delivers_its_batch(workers, no_leaks):
    # the rule that fails a batch whose re-run raises again never takes a Ctrl-C for user code
    it = iter(hr.DataLoader(IndexDataset(20), batch_size=4, num_workers=workers, in_order=True,
                            collate_fn=_GivesUpAt(KeyboardInterrupt, 4, times=2)))
    assert kinds(first_and_errors(it, KeyboardInterrupt)) == [
        0, KeyboardInterrupt, KeyboardInterrupt, 4, 8, 12, 16]


class _InterruptedTwice(IndexDataset):
    """Sample 5 is interrupted (``KeyboardInterrupt``) the first two times it loads."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.interrupts = 0

    def __getitem__(self, i: int) -> int:
        if i == 5 and self.interrupts < 2:
            self.interrupts += 1
            raise KeyboardInterrupt("simulated Ctrl-C")
        return i


def test_a_sample_interrupted_twice_still_comes(no_leaks):
    # two Ctrl-Cs on one slow sample (a notebook cell run again): the rule that fails a
    # sample whose re-run raises a BaseException again must not take a Ctrl-C for user code
    events = batches_and_errors(iter(hr.DataLoader(_InterruptedTwice(12), batch_size=4,
                                                   num_workers=0)), KeyboardInterrupt)
    assert events == [[0, 1, 2, 3], "KeyboardInterrupt", "KeyboardInterrupt", [4, 5, 6, 7],
                      [8, 9, 10, 11]]


class _Sampler:
    """0..n-1, interrupted once it reached ``at`` (a Ctrl-C while it is read)."""

    def __init__(self, n: int, at: int) -> None:
        self.n, self.at = n, at

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            if i == self.at:
                raise KeyboardInterrupt("simulated Ctrl-C")
            yield i


def test_an_interrupted_sampler_in_process_ends_the_epoch_unfinished():
    """A generator that raised is done: read on, the epoch ended early and looked finished,
    so a state_dict() then resumed nothing."""
    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=0,
                           sampler=_Sampler(N, at=10))
    got, interrupts, err = read_on(iter(loader))
    assert interrupts == 1 and isinstance(err, RuntimeError)
    assert "interrupted while it was read" in str(err)
    assert got == list(range(8))  # the batch read part-way is not delivered
    state = loader.state_dict()
    assert state["in_epoch"]
    resumed = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=0, sampler=range(N))
    resumed.load_state_dict(state)
    assert sorted(got + read_on(iter(resumed))[0]) == list(range(N))


def at_line(fn: Any, text: str, nth: int = 1,
            kind: str | None = None) -> tuple[CodeType, Callable[[FrameType, int], bool]]:
    """``fn``'s code and a ``when`` true the ``nth`` time its line holding ``text`` runs
    (``kind``: counting only when its local ``item`` is a queue item of that kind)."""
    lines, start = inspect.getsourcelines(fn)
    line = start + next(k for k, t in enumerate(lines) if text in t)
    seen = {"n": 0}

    def when(frame: FrameType, call: int) -> bool:
        if frame.f_lineno != line:
            return False
        item = frame.f_locals.get("item")
        if kind is not None and not (isinstance(item, tuple) and item[0] == kind):
            return False
        seen["n"] += 1
        return seen["n"] == nth

    return fn.__code__, when


def read_on_interrupted(loader: Any, at: tuple[CodeType, Callable[[FrameType, int], bool]]
                        ) -> tuple[list[int], BaseException | None]:
    """:func:`read_on` over a new epoch of ``loader``, interrupted once ``at`` a place; the
    indices and the error that ended it."""
    with interrupt_once(*at) as fired:
        got, interrupts, err = read_on(iter(loader))
    assert fired["n"] == 1 and interrupts == 1
    return got, err


IN_QUEUE_GET = (queue.Queue.get, "self.not_full.notify()")
"""Inside ``queue.Queue.get``, after the item left the queue, before its ``return``: where a
signal can still land before ``take`` holds the item."""


def test_a_batch_lost_inside_the_queue_ends_the_epoch_with_an_error_not_silently():
    """The one window left: inside ``queue.Queue.get`` after the batch left the queue. The
    epoch counts the batches it queued and the ones that reached the training loop; one
    short at the end is an error (unfinished: state_dict() resumes it), not a quiet end."""
    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=2)
    got, err = read_on_interrupted(loader, at_line(*IN_QUEUE_GET, nth=3, kind="batch"))
    assert isinstance(err, RuntimeError) and "1 batch(es)" in str(err)
    assert len(got) == N - 4 and len(set(got)) == len(got)
    state = loader.state_dict()
    assert state["in_epoch"]
    resumed = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=2)
    resumed.load_state_dict(state)
    assert Counter(got + read_on(iter(resumed))[0]) == Counter(range(N))


class _FailsFirst(IndexDataset):
    def __getitem__(self, i: int) -> int:
        if i < 4:
            raise ValueError(f"sample {i} is bad")
        return i


def test_a_lost_wake_up_does_not_hang_the_epoch():
    """The first four samples (every one in flight) are skipped: the scheduler then asks the
    training thread to read the sampler ("feed" on its queue). That request lost inside
    ``queue.Queue.get`` left both threads waiting for each other; the waiting thread now reads
    what was asked once nothing came for ``GET_POLL_S``. ``timeout=`` turns a hang into an
    error here."""
    loader = hr.DataLoader(_FailsFirst(N), batch_size=4, num_workers=2, in_order=False, timeout=20,
                           options=hr.Options(on_error="skip", max_in_flight=4))
    got, err = read_on_interrupted(loader, at_line(*IN_QUEUE_GET, kind="feed"))
    assert err is None and Counter(got) == Counter(range(4, N))


def test_an_interrupt_right_after_a_batch_left_the_queue_holds_it():
    """Between the queue's get and the batch's return (the stall's clock read): dropped
    there, the batch was lost, and the end of the epoch said so (the safety net); now the
    next take returns it."""
    from headrace.runtime.epoch import EpochIterator

    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=2)
    got, err = read_on_interrupted(loader, at_line(
        EpochIterator.take, "self.meter.stall_s += time.perf_counter() - t0", 3))
    assert err is None and Counter(got) == Counter(range(N))


def test_an_interrupt_after_an_in_process_batch_is_collated_keeps_its_samples():
    from headrace.runtime.inprocess import InProcessIterator

    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=0)
    got, err = read_on_interrupted(loader, at_line(
        InProcessIterator._collate, "m.stall_s += time.perf_counter() - t0", 2))
    assert err is None and Counter(got) == Counter(range(N))


class _RaisingSampler(_Sampler):
    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            if i == self.at:
                raise ValueError("the sampler broke")
            yield i


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_error_comes_once_after_what_was_read_then_the_epoch_ends(workers):
    """As torch raises it (once, then StopIteration), and the same with or without workers;
    the epoch stays unfinished, so state_dict() resumes the rest."""
    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=workers, in_order=True,
                           sampler=_RaisingSampler(N, at=6))
    it = iter(loader)
    got, outcome = [], []
    for _ in range(6):
        try:
            got.extend(next(it).tolist())
            outcome.append("batch")
        except ValueError as e:
            outcome.append(str(e))
        except StopIteration:
            outcome.append("stop")
            break
    assert got[:4] == [0, 1, 2, 3] and "the sampler broke" in outcome
    assert outcome.count("the sampler broke") == 1 and outcome[-1] == "stop"
    assert loader.state_dict()["in_epoch"]


def _started_inside_launch(frame: FrameType, call: int) -> bool:
    """multiprocessing's ``Finalize`` made by ``Popen._launch`` in this process: after the
    fork, before the ``Process`` kept the child's pid."""
    from multiprocessing import popen_fork

    return frame.f_back is not None and frame.f_back.f_code is popen_fork.Popen._launch.__code__


def _post_fork_points() -> list[Any]:
    from multiprocessing import util

    from headrace.runtime.handles import WorkerHandle
    from headrace.runtime.taskpipe import TaskPipe

    return [
        pytest.param(TaskPipe.__init__.__code__, nth_call(1), id="TaskPipe.__init__"),
        pytest.param(WorkerHandle.__init__.__code__, nth_call(1), id="WorkerHandle.__init__"),
        pytest.param(util.Finalize.__init__.__code__, _started_inside_launch,
                     id="Popen._launch-after-fork"),
    ]


@pytest.mark.parametrize(("code", "when"), _post_fork_points())
def test_a_ctrl_c_right_after_a_worker_forks_leaves_no_worker_alive(code, when):
    """A Ctrl-C landing between a worker's fork and the pool's record of it, caught as a
    notebook does: the worker is killed and reaped, or (cut inside ``multiprocessing``, no pid
    kept) reads EOF on its task pipe and exits. Before, it waited on its pipe (it held a copy of
    our end) until the training process exited, seen by no shutdown."""
    import gc

    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children()}
    loader = hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=2)
    with interrupt_once(code, when) as fired, pytest.raises(KeyboardInterrupt):
        iter(loader)
    assert fired["n"] == 1
    del loader
    gc.collect()
    new = [p for p in me.children() if p.pid not in before]
    _, alive = psutil.wait_procs(new, timeout=10)  # reaps the exited ones (zombies included)
    assert not alive, f"workers still alive after the interrupted start: {alive}"
    got = [i for b in hr.DataLoader(IndexDataset(N), batch_size=4, num_workers=2) for i in b.tolist()]
    assert sorted(got) == list(range(N))
