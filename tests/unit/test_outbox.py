"""A worker process's Outbox (runtime/worker.py): which finished samples it keeps, and that
what it keeps always goes out, in order, over a real pipe."""

import multiprocessing as mp
import os
import threading
import time
import types

import numpy as np

from headrace.runtime.outbox import Outbox, RingSender
from headrace.runtime.ring import Ring, RingWriter
from headrace.runtime.scheduler import _free_ring


def done(tid):
    return ("done", tid, None, [], 0, tid * 64)


def pipe(hold_s=60.0):
    r, w = mp.get_context("fork").Pipe(duplex=False)
    box = Outbox(w)
    box.hold_s = hold_s  # what the worker's last task message said
    return r, box


def test_hold_zero_sends_every_sample_on_its_own():
    r, box = pipe(0.0)
    assert box.add(done(1), time.monotonic()) and box.add(done(2), time.monotonic())
    assert r.recv() == done(1) and r.recv() == done(2)
    assert not r.poll(0)


def test_cheap_samples_are_kept_then_sent_in_one_message_in_order():
    r, box = pipe()
    for tid in (1, 2, 3):
        assert box.add(done(tid), time.monotonic())
    assert not r.poll(0)  # kept: younger than hold_s
    box.since -= 61.0  # the first one kept is now older than hold_s
    assert box.add(done(4), time.monotonic())
    assert r.recv() == ("many", [done(1), done(2), done(3), done(4)])
    assert box.kept == []


def test_a_sample_longer_than_the_hold_is_sent_at_once_with_what_was_kept():
    r, box = pipe()
    assert box.add(done(1), time.monotonic())
    assert box.add(done(2), time.monotonic() - 61.0)  # it ran 61 s: nothing may wait
    assert r.recv() == ("many", [done(1), done(2)])


def test_a_hand_off_or_an_error_goes_at_once_with_what_was_kept():
    r, box = pipe()
    box.add(done(1), time.monotonic())
    partial = ("partial", 2, 3, None, [], 0, None, 128)
    box.add(partial, time.monotonic())
    assert r.recv() == ("many", [done(1), partial])
    err = ("error", 3, 1, None, "ValueError", "bad", "tb")
    box.add(err, time.monotonic())
    assert r.recv() == err


def test_flush_sends_what_was_kept_and_nothing_when_empty():
    r, box = pipe()
    assert box.flush() and not r.poll(0)
    box.add(done(1), time.monotonic())
    assert box.flush()
    assert r.recv() == done(1)


def test_an_unpicklable_sample_among_kept_ones_is_named_and_the_others_arrive():
    r, box = pipe()
    box.add(done(1), time.monotonic())
    box.add(("done", 2, threading.Lock(), [], 0, 128), time.monotonic())  # cannot be pickled
    box.add(done(3), time.monotonic())
    assert box.flush()
    assert r.recv() == done(1)
    err = r.recv()
    assert err[0] == "error" and err[1] == 2 and "could not be sent" in err[5]
    assert r.recv() == done(3)


def test_a_closed_pipe_reports_the_training_process_gone():
    r, box = pipe()
    r.close()
    box.add(done(1), time.monotonic())
    assert box.add(done(2), time.monotonic()) is True  # kept: nothing written yet
    assert box.flush() is False


def test_a_kept_sample_that_does_not_pickle_frees_its_ring_space_for_the_next():
    # A kept sample filling the ring holds a lock: its message fails to pickle when the next
    # sample's wait for ring space flushes the outbox. Its error carried no ring end, so its
    # space stayed held and the next sample waited for ever (a review; the writer's rewind
    # that stood in for it did nothing while another value was being encoded).
    ring = Ring(mp.get_context("spawn"))  # 16 MiB, as a spawned worker's
    writer = RingWriter(ring, os.getpid())
    sender = RingSender(writer)
    r, box = pipe(hold_s=60.0)
    writer.before_wait = box.flush
    handle = types.SimpleNamespace(ring=ring)
    got: list[str] = []

    def scheduler() -> None:  # reads and frees as the scheduler does, until the second sample
        while "done" not in got:
            m = r.recv()
            for x in (m[1] if m[0] == "many" else [m]):
                got.append(x[0])
                _free_ring(handle, (x,))

    reader = threading.Thread(target=scheduler, daemon=True)
    reader.start()
    big = [np.full(1 << 19, float(k)) for k in range(4)] + [threading.Lock()]
    payload, end = sender(big)
    assert box.add(("done", 1, payload, [], 0, end), time.monotonic())  # kept
    sent = threading.Event()

    def next_sample() -> None:
        p, e = sender(np.zeros(1024))  # waits for ring space: flushes the kept one first
        box.add(("done", 2, p, [], 0, e), time.monotonic())
        box.flush()
        sent.set()

    writer_thread = threading.Thread(target=next_sample, daemon=True)
    writer_thread.start()
    assert sent.wait(30), "the next sample waited for ring space the unsent one kept"
    writer_thread.join(30)
    reader.join(30)
    assert not reader.is_alive() and got == ["error", "done"]
