import collections
import multiprocessing as mp
from collections import namedtuple

import numpy as np
import pytest
import torch

from headrace.runtime.ring import MAX_VISITS, MIN_LEAF, Ring, RingRef, RingWriter, decode, encode

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


def test_oversized_leaves_fall_back():
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    huge = np.zeros(64 * 1024, dtype=np.uint8)  # over a quarter of the ring
    enc = encode({"huge": huge}, w)
    assert enc["huge"] is huge


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.complex32, torch.float8_e4m3fn,
                                   torch.float8_e5m2, torch.float8_e4m3fnuz])
def test_dtypes_numpy_lacks_go_through_the_ring_bit_for_bit(dtype):
    # they went to torch's shared-memory path, one descriptor per tensor
    ring = Ring(mp.get_context("fork"), size=1 << 20)
    w = RingWriter(ring, parent_pid=0)
    raw = torch.arange(8192 * dtype.itemsize, dtype=torch.int64).remainder(256).to(torch.uint8)
    x = raw.view(dtype).reshape(64, -1)  # every bit pattern, NaNs included
    for sample in (x, x.t()):  # contiguous, and a transposed view
        enc = encode(sample, w)
        assert isinstance(enc, RingRef)
        back = decode(enc, ring)
        assert back.dtype == dtype and back.shape == sample.shape
        assert torch.equal(back.view(torch.uint8), sample.contiguous().view(torch.uint8))


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
            ("partial", 3, 2, None, [], 0, None, 12288)]
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
        held, ends, tops = [], [], []
        for i in range(300):
            held.append((w.put(np.full(16384, i, dtype=np.float32)), i))
            ends.append(w.write_pos)
            tops.append(held[-1][0] + 65536)
            if len(held) > behind:  # the reader takes the oldest: still intact, then freed
                off, v = held.pop(0)
                assert (np.frombuffer(ring.buf, np.float32, 16384, off) == v).all()
                ring.read_pos.value = ends[i - behind]
        assert w.span == most and max(tops) <= most


def test_a_reader_one_large_array_behind_keeps_the_span_at_two_arrays():
    # Arrays larger than the first span (1 MB): the reader takes the first ones at once, then
    # falls one array behind. The writer went back to the start behind a pad up to the ring's
    # end, freed only with the array after it, so the next array waited on the pad, the span
    # doubled to the whole ring and every page of it was written (20 MB samples: 180-240 MB of
    # each 256 MB ring resident with 2 workers), or waited, had the reader not moved. Two
    # arrays' worth is enough, and the writer never waits.
    ring = Ring(mp.get_context("fork"), size=16 << 20)
    w = RingWriter(ring, parent_pid=0)

    def waits() -> None:
        raise AssertionError("the writer waited for space with one array held")

    w.before_wait = waits
    n = 5 << 18  # 1.25 MB
    ends, tops = [], []
    for i in range(40):
        off = w.put(np.full(n // 4, i, dtype=np.float32))
        assert (np.frombuffer(ring.buf, np.float32, n // 4, off) == i).all()
        ends.append(w.write_pos)
        tops.append(off + n)
        if i < 5:
            ring.read_pos.value = ends[i]  # taken at once
        else:
            ring.read_pos.value = ends[i - 1]  # the reader one array behind
    assert w.span == 4 << 20 and max(tops) <= 4 << 20  # the power of two over 2 x 1.25 MB


def test_place_fills_one_circular_run_inside_the_span():
    from headrace.runtime.ring import place

    assert place([], 10, 100) == 0  # nothing held: the start
    assert place([], 101, 100) is None
    assert place([(0, 20, 30)], 10, 100) == 50  # after the newest
    assert place([(0, 20, 30)], 20, 60) == 0  # no room after it: the start is clear of it
    assert place([(0, 20, 30)], 21, 60) is None  # neither
    held = [(0, 60, 30), (0, 0, 20)]  # wrapped: the room is between the newest and the oldest
    assert place(held, 40, 100) == 20 and place(held, 41, 100) is None


def test_the_span_grows_only_where_that_makes_room():
    from headrace.runtime.ring import grown_span

    assert grown_span([(0, 0, 40)], 40, 64, 1024) == 128  # after the held array
    assert grown_span([], 300, 64, 1024) == 512  # one array larger than the span
    assert grown_span([(0, 0, 40)], 1000, 64, 1024) == 64  # would not fit even in the ring
    # wrapped round the start: a larger span leaves the room between them as it is, so the
    # writer waits for the consumer instead of touching more of the ring
    assert grown_span([(0, 40, 20), (0, 0, 20)], 30, 64, 1024) == 64


def _no_wait() -> None:
    pytest.fail("the writer waited for room only its own sample's message could free")


def test_a_sample_larger_than_the_ring_sends_what_does_not_fit_another_way():
    # five arrays of a quarter of the ring each: the fifth found no room that any wait could
    # make (only this sample's own message, not yet sent, frees the first four), and the
    # worker waited for ever (5 x 4 MiB in a spawned worker's 16 MiB ring; a review)
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    w.before_wait = _no_wait
    arrays = [np.full(4096, i, dtype=np.float32) for i in range(5)]  # 16 KB each
    enc = encode(arrays, w, lambda leaf: ("other", leaf))
    assert [isinstance(e, RingRef) for e in enc] == [True] * 4 + [False]
    assert enc[4][0] == "other" and enc[4][1] is arrays[4]
    assert w.value_start is None  # between values again
    ring.read_pos.value = w.write_pos  # the reader took it: the next sample uses the ring
    assert all(isinstance(e, RingRef) for e in encode(arrays[:4], w))


def test_a_sample_wrapping_onto_its_own_first_array_sends_it_another_way():
    # an earlier sample's 4 KB array at the ring's start, not yet taken: this sample's three
    # 16 KB arrays go after it, and its fourth fits only at the start, where its own first
    # one is in the way once the earlier array is freed: no wait can make room (a review: a
    # 16 MiB sample of four 4 MiB arrays after 100 small ones hung a spawned worker)
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    w.before_wait = _no_wait
    earlier = encode([np.zeros(1024, dtype=np.float32)], w)
    arrays = [np.full(4096, i, dtype=np.float32) for i in range(4)]
    enc = encode(arrays, w, lambda leaf: ("other", leaf))
    assert isinstance(earlier[0], RingRef) and earlier[0].offset == 0
    assert [isinstance(e, RingRef) for e in enc] == [True, True, True, False]
    assert enc[3][0] == "other" and enc[3][1] is arrays[3]
    ring.read_pos.value = w.write_pos
    assert all(np.array_equal(d, a) for d, a in zip(decode(enc[:3], ring), arrays[:3],
                                                     strict=True))


def test_ring_space_of_messages_arriving_after_the_epoch_finished_is_freed():
    # they are dropped (the epoch is over); their ring space stayed held until the worker's
    # next message was read, which a persistent worker's full ring could wait for
    from types import SimpleNamespace

    from headrace.runtime.handles import WorkerHandle
    from headrace.runtime.scheduler import Scheduler

    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = WorkerHandle(0, None, None, None, ring)
    ring.read_pos.value = 4096
    handled: list[str] = []
    epoch = SimpleNamespace(_finished=True, _handle=lambda _w, m: handled.append(m[0]))
    Scheduler._handle_all(epoch, w, [("done", 1, None, [], 0, 8192), ("ready", 0, None),
                                     ("partial", 3, 2, None, [], 0, None, 12288)])
    assert handled == ["ready"] and ring.read_pos.value == 12288
    epoch._finished = False
    Scheduler._handle_all(epoch, w, [("done", 4, None, [], 0, 16384)])
    assert handled == ["ready", "done"] and ring.read_pos.value == 12288  # _handle frees those


def test_a_value_counts_the_bytes_of_its_arrays_that_went_beside_the_ring():
    """What a message's ring end does not count: arrays over a quarter of the ring, strided
    ones, bytes (torch's shared memory), which cap how deep a worker's queue is too
    (``Counters.sent_bytes``; unprofiled, nothing else measures a sample's size)."""
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    big, flipped = np.zeros(8192, np.float32), np.zeros(2048, np.float32)[::-1]
    encode({"in": np.zeros(2048, np.float32), "big": big, "t": torch.zeros(4096 * 2),
            "flip": flipped, "raw": bytes(5000), "small": np.zeros(3)}, w)
    assert ring.beside.value == big.nbytes + 4096 * 2 * 4 + flipped.nbytes + 5000
    encode({"in": np.zeros(2048, np.float32)}, w)  # the next value's own count
    assert ring.beside.value == 0
    # a dict subclass is one leaf to the ring, whose arrays the transport shares (a review:
    # none counted); a sparse tensor's numel() is its dense size (a review: 4 GB counted for
    # 5 values)
    sparse = torch.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (1 << 30,))  # 2 values, 2 indices
    encode({"od": collections.OrderedDict(a=big, b=[bytes(5000), 3]), "s": sparse}, w)
    assert ring.beside.value == big.nbytes + 5000 + 2 * 4 + 2 * 8
    # a dict subclass's values are copied one by one: an array held there 50 times is sent
    # 50 times (a review: counted once, the queue 50 times too deep)
    encode(collections.OrderedDict(a=[big] * 50, b=big), w)
    assert ring.beside.value == 51 * big.nbytes
    nested = torch.nested.nested_tensor([torch.zeros(3000), torch.zeros(1000)],
                                        layout=torch.jagged)  # 4000 values, 3 offsets
    encode(nested, w)
    assert ring.beside.value == 4000 * 4 + 3 * 8
    csr = torch.eye(64).to_sparse_csr()  # 64 values, 65 row pointers, 64 column indices
    encode([csr], w)
    assert ring.beside.value == 64 * 4 + 65 * 8 + 64 * 8


class _LazyValues(dict):
    def values(self):
        raise KeyError("lazy")


class _Many(list):
    pass


def test_the_bytes_beside_the_ring_are_an_estimate_that_never_fails_a_sample():
    """Odd leaves count what can be read of them, never fail their sample for it (a review: a
    dict subclass whose ``values()`` raises failed a sample the transport and pickle send),
    and the walk of a container leaf looks at ``MAX_VISITS`` items at most (a list subclass
    holding a 10,000-int list 1,024 times took 414 ms a sample), a sequence of scalars charged
    as the items it is worth, not one each (a review: 1,100 token ids before an array spent
    the budget, and the array counted nothing)."""
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    big = np.zeros(8192, np.float32)  # over a quarter of the ring: beside it
    encode({"d": _LazyValues(x=big)}, w)
    assert ring.beside.value == big.nbytes  # items(), as the transport reads a dict
    inner = list(range(10_000))
    encode({"m": _Many([[inner]] * (MAX_VISITS + 1) + [big])}, w)
    assert ring.beside.value == 0  # the array came after the items looked at
    encode({"m": _Many([big, inner])}, w)
    assert ring.beside.value == big.nbytes
    encode(collections.OrderedDict(input_ids=list(range(2000)), pixels=big), w)
    assert ring.beside.value == big.nbytes
    encode(collections.OrderedDict(boxes=[[1.0, 2.0, 3.0, 4.0]] * 600, image=big), w)
    assert ring.beside.value == big.nbytes  # (a review: 512 short lists spent the budget)
