import multiprocessing as mp
from collections import namedtuple

import numpy as np
import torch

from headrace.runtime.ring import MIN_LEAF, Ring, RingRef, RingWriter, decode, encode

P = namedtuple("P", "a b")


def test_arrays_and_tensors_roundtrip_through_the_ring_and_small_ones_stay_inline():
    ring = Ring(mp.get_context("fork"), size=1 << 20)
    w = RingWriter(ring, parent_pid=0)
    big = np.arange(MIN_LEAF, dtype=np.int32)
    sample = {"x": big, "t": torch.ones(64, 64), "s": np.zeros(3), "p": P(torch.arange(2000.0), "k")}
    enc = encode(sample, w)
    assert isinstance(enc["x"], RingRef) and isinstance(enc["t"], RingRef)
    assert isinstance(enc["s"], np.ndarray) and isinstance(enc["p"].a, RingRef)
    dec = decode(enc, ring)
    assert np.array_equal(dec["x"], big) and dec["x"].dtype == np.int32
    assert isinstance(dec["t"], torch.Tensor) and torch.equal(dec["t"], torch.ones(64, 64))
    assert isinstance(dec["p"], P) and dec["p"].b == "k"
    big[0] = 99  # decoded arrays are copies: the ring slot can be reused
    assert dec["x"][0] == 0


def test_writer_wraps_around_once_the_reader_has_freed_space():
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    offsets = []
    lagging = 0
    for i in range(10):  # 10 x 12 KB through a 64 KB ring
        off = w.put(np.full(3072, i, dtype=np.float32))
        offsets.append(off)
        got = np.frombuffer(ring.buf, dtype=np.float32, count=3072, offset=off)
        assert (got == i).all()
        ring.read_pos.value, lagging = lagging, w.write_pos  # the reader one array behind
    assert min(offsets) == 0 and offsets.count(0) >= 2 and max(offsets) > 32 * 1024  # wrapped


def test_a_ring_the_reader_keeps_up_with_is_written_from_its_start():
    # each array freed before the next is written: the writer goes back to the start, so the
    # ring touches only the pages one array needs, not all of them on its way round
    ring = Ring(mp.get_context("fork"), size=1 << 20)
    w = RingWriter(ring, parent_pid=0)
    offsets = []
    for i in range(40):
        offsets.append(w.put(np.full(16384, i, dtype=np.float32)))  # 64 KB
        if i % 4 == 3:
            ring.read_pos.value = w.write_pos  # four in flight, then all taken
    assert max(offsets) < 256 * 1024 and offsets.count(0) == 10


def test_bfloat16_and_oversized_leaves_fall_back():
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    bf = torch.ones(4096, dtype=torch.bfloat16)
    huge = np.zeros(64 * 1024, dtype=np.uint8)  # over a quarter of the ring
    enc = encode({"bf": bf, "huge": huge}, w)
    assert enc["bf"] is bf and enc["huge"] is huge


def test_a_full_ring_asks_its_writer_to_send_what_it_kept_before_waiting():
    # A worker that keeps finished samples (Outbox) must send them before it waits for ring
    # space: the training process frees that space only once it has their messages.
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    kept_ends = []
    for _ in range(5):  # 5 x 12 KB fit; none freed: they are "kept"
        w.put(np.zeros(3072, dtype=np.float32))
        kept_ends.append(w.write_pos)
    calls = []

    def send_kept():  # the training process gets them and frees their space
        calls.append(len(kept_ends))
        ring.read_pos.value = kept_ends[-1]

    w.before_wait = send_kept
    w.put(np.ones(3072, dtype=np.float32))  # would wait forever without the hook
    assert calls == [5]
    w.put(np.ones(3072, dtype=np.float32))  # room again: no call
    assert calls == [5]


def test_ring_space_of_messages_an_error_left_unhandled_is_freed_and_never_taken_back():
    from headrace.runtime.handles import WorkerHandle
    from headrace.runtime.scheduler import _free_ring

    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = WorkerHandle(0, None, None, None, ring)
    ring.read_pos.value = 4096
    msgs = [("done", 1, None, [], 0, 8192), ("error", 2, 1, None, "E", "e", "tb"),
            ("partial", 3, 2, None, [], 0, 12288)]
    _free_ring(w, msgs)
    assert ring.read_pos.value == 12288  # up to the last handed-off sample's end
    _free_ring(w, [("done", 0, None, [], 0, 1024)])
    assert ring.read_pos.value == 12288  # a stale, earlier end never moves it back


def test_a_writer_touches_only_the_span_its_arrays_in_flight_need():
    # 64 KB arrays, the reader freeing them `behind` arrays late: a 16 MB ring was written all
    # the way round (32 workers: 512 MB of shared memory); now the span grows to what is held
    for behind, most in ((4, 1 << 20), (40, 4 << 20)):
        ring = Ring(mp.get_context("fork"), size=16 << 20)
        w = RingWriter(ring, parent_pid=0)
        held, ends = [], []
        for i in range(300):
            held.append((w.put(np.full(16384, i, dtype=np.float32)), i))
            ends.append(w.write_pos)
            if len(held) > behind:  # the reader takes the oldest: still intact, then freed
                off, v = held.pop(0)
                assert (np.frombuffer(ring.buf, np.float32, 16384, off) == v).all()
                ring.read_pos.value = ends[i - behind]
        assert w.span == most and max(e % ring.size or ring.size for e in ends) <= most
