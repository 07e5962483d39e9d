import pickle
from collections import namedtuple

import numpy as np
import torch

from headrace.runtime.bitmap import Bitmap
from headrace.runtime.transport import INLINE_LIMIT, _Shm, decode, encode

P = namedtuple("P", "a b")


def test_bitmap_set_contains_roundtrip():
    b = Bitmap()
    for i in (0, 7, 8, 1000):
        assert b.set(i)
    assert not b.set(7)
    assert b.count == 4 and 1000 in b and 999 not in b
    c = Bitmap.from_str(b.to_str())
    assert c.count == 4 and all(i in c for i in (0, 7, 8, 1000))


def test_large_leaves_go_through_shared_memory_and_come_back_equal():
    big = np.arange(INLINE_LIMIT, dtype=np.float32)
    sample = {"a": big, "b": [b"x" * INLINE_LIMIT, 3], "c": P(torch.ones(2), np.zeros(2))}
    enc = encode(sample)
    assert isinstance(enc["a"], _Shm) and isinstance(enc["b"][0], _Shm)
    assert isinstance(enc["c"].b, np.ndarray)  # small: inline
    dec = decode(pickle.loads(pickle.dumps(enc)))
    assert np.array_equal(dec["a"], big) and dec["a"].dtype == np.float32
    assert dec["b"] == [b"x" * INLINE_LIMIT, 3]
    assert isinstance(dec["c"], P) and torch.equal(dec["c"].a, torch.ones(2))
