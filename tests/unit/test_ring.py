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
    for i in range(10):  # 10 x 12 KB through a 64 KB ring
        off = w.put(np.full(3072, i, dtype=np.float32))
        offsets.append(off)
        got = np.frombuffer(ring.buf, dtype=np.float32, count=3072, offset=off)
        assert (got == i).all()
        ring.read_pos.value = w.write_pos  # the reader consumed it
    assert min(offsets) == 0 and offsets.count(0) >= 2  # wrapped


def test_bfloat16_and_oversized_leaves_fall_back():
    ring = Ring(mp.get_context("fork"), size=64 * 1024)
    w = RingWriter(ring, parent_pid=0)
    bf = torch.ones(4096, dtype=torch.bfloat16)
    huge = np.zeros(64 * 1024, dtype=np.uint8)  # over a quarter of the ring
    enc = encode({"bf": bf, "huge": huge}, w)
    assert enc["bf"] is bf and enc["huge"] is huge
