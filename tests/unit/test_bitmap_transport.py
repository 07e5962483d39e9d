import pickle
from collections import namedtuple
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers torch's reductions

from headrace.runtime.bitmap import Bitmap
from headrace.runtime.transport import INLINE_LIMIT, _Inline, _Shm, decode, encode

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


def test_a_large_tensor_is_sent_as_a_shared_copy_and_stays_the_senders_own():
    # torch's pickling moves the storage it is given to shared memory in place: the receiver
    # would read a buffer the sender fills again, and a preloaded sample would stay shared
    whole = torch.zeros(INLINE_LIMIT, dtype=torch.uint8)
    sent = encode(whole)
    assert sent is not whole and sent.untyped_storage().is_shared()
    ForkingPickler.dumps(sent)  # what a worker's pipe does to it (torch's reductions)
    assert not whole.untyped_storage().is_shared()
    whole[0] = 1
    assert sent[0] == 0


def test_tensors_without_a_numpy_dtype_travel_inline_as_their_bits():
    for t in ((torch.ones(3) * 2).to(torch.float8_e4m3fn), torch.ones(3, dtype=torch.chalf),
              torch.ones(3, dtype=torch.bfloat16)):
        enc = encode(t)
        assert isinstance(enc, _Inline)
        back = decode(pickle.loads(pickle.dumps(enc)))
        assert back.dtype == t.dtype and torch.equal(back.view(torch.uint8), t.view(torch.uint8))


def test_parameters_and_tensors_that_require_grad_are_sent_as_copies_that_keep_them():
    for t in (torch.nn.Parameter(torch.ones(3)), torch.ones(3, requires_grad=True)):
        enc = encode(t)
        assert enc is not t and type(enc) is type(t) and enc.requires_grad
        assert enc.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
        assert torch.equal(enc.detach(), t.detach())


@pytest.mark.parametrize("size", [3, 300_000])  # inline, and above INLINE_LIMIT (torch's own)
def test_conjugate_and_negative_views_arrive_as_the_same_views(size):
    z = torch.arange(float(size)).to(torch.cfloat) * (1 + 2j)
    for t in (z.conj(), z.conj().imag, torch._neg_view(z.conj())):
        back = decode(pickle.loads(pickle.dumps(encode(t))))
        assert (back.is_conj(), back.is_neg()) == (t.is_conj(), t.is_neg())
        assert torch.equal(back.resolve_conj().resolve_neg(), t.resolve_conj().resolve_neg())


@pytest.mark.parametrize("size", [5, INLINE_LIMIT])  # inline, and through shared memory
def test_negative_strides_arrive_as_they_were_made(size):
    a = np.arange(2 * size, dtype=np.int32).reshape(2, size)[::-1, ::-2]
    back = decode(pickle.loads(pickle.dumps(encode(a))))
    assert np.array_equal(back, a) and [s < 0 for s in back.strides] == [True, True]
