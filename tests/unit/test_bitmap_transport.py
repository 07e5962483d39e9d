import pickle
from collections import namedtuple

import numpy as np
import pytest
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


def test_a_large_view_carries_its_own_bytes_not_its_whole_storage():
    # ``self.data[i]`` of a big tensor: torch's pickling would share the whole storage
    data = torch.zeros(8, INLINE_LIMIT, dtype=torch.uint8)
    row = data[3]
    sent = encode(row)
    assert torch.equal(sent, row)
    assert sent.untyped_storage().nbytes() == row.numel()
    whole = torch.zeros(INLINE_LIMIT, dtype=torch.uint8)
    assert encode(whole) is whole  # nothing to trim: no copy


def test_tensors_without_a_numpy_view_or_with_more_than_bytes_travel_as_torch_pickles_them():
    for t in ((torch.ones(3) * 2).to(torch.float8_e4m3fn), torch.ones(3, dtype=torch.chalf),
              torch.nn.Parameter(torch.ones(3)), torch.ones(3, requires_grad=True)):
        assert encode(t) is t  # never an _Inline: it would lose the dtype or grad


@pytest.mark.parametrize("size", [3, 300_000])  # inline, and above INLINE_LIMIT (torch's own)
def test_conjugate_and_negative_views_arrive_as_the_same_views(size):
    z = torch.arange(float(size)).to(torch.cfloat) * (1 + 2j)
    for t in (z.conj(), z.conj().imag, torch._neg_view(z.conj())):
        back = decode(pickle.loads(pickle.dumps(encode(t))))
        assert (back.is_conj(), back.is_neg()) == (t.is_conj(), t.is_neg())
        assert torch.equal(back.resolve_conj().resolve_neg(), t.resolve_conj().resolve_neg())
