import multiprocessing as mp
import select
import threading

import numpy as np
import pytest

from headrace.runtime.taskpipe import TaskPipe


def test_sends_never_block_and_arrive_whole_and_in_order():
    reader, writer = mp.get_context("fork").Pipe(duplex=False)
    pipe = TaskPipe(writer)
    big = np.arange(300_000, dtype=np.int64)  # 2.4 MB: far over a pipe's buffer
    pipe.send(("first", 1))
    pipe.send(("big", big))  # nobody reads yet: a blocking write would hang here
    pipe.send(None)
    assert pipe.pending
    got = []
    drain = threading.Thread(target=lambda: got.extend(reader.recv() for _ in range(3)))
    drain.start()  # the worker's side: reads whole frames
    for _ in range(10_000):  # bounded: each round the reader has made room (select says so)
        if pipe.flush():
            break
        assert select.select([], [pipe.fileno()], [], 10)[1], "the pipe never drained"
    drain.join(10)
    assert not pipe.pending and not drain.is_alive()
    assert got[0] == ("first", 1) and got[2] is None
    assert got[1][0] == "big" and np.array_equal(got[1][1], big)
    pipe.close()


def test_a_send_to_a_closed_pipe_raises_oserror():
    reader, writer = mp.get_context("fork").Pipe(duplex=False)
    pipe = TaskPipe(writer)
    reader.close()
    with pytest.raises(OSError):
        pipe.send("x")
    # the worker is gone: nothing waits, and the scheduler's flush on every loop never raises
    assert not pipe.pending and pipe.flush()
    pipe.close()


def test_flush_after_the_reader_died_with_bytes_waiting_drops_them_without_raising():
    reader, writer = mp.get_context("fork").Pipe(duplex=False)
    pipe = TaskPipe(writer)
    pipe.send(np.zeros(200_000))  # more than the pipe holds: the rest waits in the outbox
    assert pipe.pending
    reader.close()
    assert pipe.flush() and not pipe.pending
    pipe.close()
