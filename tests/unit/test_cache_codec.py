"""The cache's raw format: exact round trips, refusals, and no code execution on decode."""

from __future__ import annotations

import pathlib
import pickle

import numpy as np
import pytest
import torch

from headrace.cache import codec
from headrace.errors import HeadraceError


def _same(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


VALUES = [
    None, True, False, 0, -(2**63), 2**63 - 1, 1.5, float("nan"), "héllo", b"\x00\xffraw",
    np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    np.arange(10, dtype=np.int64)[::3],  # not contiguous
    np.zeros((0, 5), dtype=np.uint8),
    np.array([1 + 2j, 3j], dtype=np.complex128),
    np.array(["ab", "c"]),
    np.float32(2.5), np.int16(-3),
    torch.arange(12, dtype=torch.float64).reshape(3, 4).t(),
    torch.ones(3, dtype=torch.bfloat16) / 3,
    torch.tensor([True, False]),
    torch.empty(0, 2, dtype=torch.int32),
    {"image": np.ones((4, 4, 3), np.uint8), "label": 3, "meta": ("x", [1.0, None])},
    [(1, 2), [3, {"a": b"b"}]],
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_round_trip_is_element_for_element(value) -> None:
    _same(value, codec.decode(codec.encode(value)))


def test_decoded_arrays_are_private_and_writable() -> None:
    blob = bytearray(codec.encode({"a": np.arange(5), "t": torch.zeros(3)}))
    out = codec.decode(blob)
    out["a"] += 1
    out["t"] += 1
    again = codec.decode(blob)
    np.testing.assert_array_equal(again["a"], np.arange(5))
    assert torch.equal(again["t"], torch.zeros(3))


class Box:
    pass


@pytest.mark.parametrize("value", [
    Box(), {1: 2}, np.array([object()], dtype=object), 2**64, (1, Box()),
    torch.zeros(2, requires_grad=True),
    np.zeros(2, dtype=[("a", "f4"), ("b", "i8")]),  # its fields were lost on a hit
    np.zeros(2, dtype="V12"),
])
def test_what_the_format_cannot_hold_is_refused(value) -> None:
    with pytest.raises(codec.Uncacheable):
        codec.encode(value)


class _Touch:
    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


def test_a_pickle_is_never_executed(tmp_path) -> None:
    marker = tmp_path / "executed"
    payload = pickle.dumps(_Touch(marker))
    for blob in (payload, codec.MAGIC + payload):
        with pytest.raises(codec.CorruptEntry) as e:
            codec.decode(blob)
        assert isinstance(e.value, HeadraceError)
    assert not marker.exists()


@pytest.mark.parametrize("cut", [5, 12, 40])
def test_truncated_blobs_are_corrupt(cut) -> None:
    blob = codec.encode({"x": np.arange(100)})
    with pytest.raises(codec.CorruptEntry):
        codec.decode(blob[:cut])
    with pytest.raises(codec.CorruptEntry):
        codec.decode(blob + b"x")


_BASE = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
_IMG = np.arange(40 * 30, dtype=np.int16).reshape(40, 30)
_T = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
LAYOUTS = {
    "fortran": np.asfortranarray(_BASE),
    "transpose": _BASE.transpose(2, 0, 1),
    "flip": _BASE[:, ::-1],
    "crop": _IMG[10:20, 5:9],  # gaps between rows
    "flipped crop": _IMG[::-2, 3:7],
    "broadcast": np.broadcast_to(np.arange(3.0), (4, 3)),  # zero strides
    "new axis": np.arange(5)[:, None],
    "fortran row": np.asfortranarray(np.ones((1, 5))),
    "channels_last": _T.contiguous(memory_format=torch.channels_last),
    "tensor transpose": _T.transpose(1, 3),
    "tensor crop": _T[:, :, 1:3, 1:4],
    "expanded": torch.arange(3.0).expand(4, 3),
    "bfloat16 permuted": _T.to(torch.bfloat16).permute(3, 1, 2, 0),
    "complex transpose": torch.arange(12.0).reshape(3, 4).to(torch.complex128).t(),
}


def _layout(x):
    if isinstance(x, torch.Tensor):
        return (x.stride(), x.is_contiguous(),
                x.is_contiguous(memory_format=torch.channels_last))
    return x.strides, x.flags.c_contiguous, x.flags.f_contiguous


WIDE = {"crop", "flipped crop", "tensor crop"}
"""Views whose elements span more than ``codec.SPAN_FACTOR`` times their own bytes: their
layout is not kept (a hit would rebuild the whole span), they come back C-ordered."""


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_hit_keeps_the_memory_layout_a_computed_sample_has(name) -> None:
    value = LAYOUTS[name]
    out = codec.decode(codec.encode({"x": value}))["x"]
    _same(value, out)
    if name in WIDE:
        contiguous = value.contiguous() if isinstance(value, torch.Tensor) else value.copy()
        assert _layout(out) == _layout(contiguous)
    else:
        assert _layout(out) == _layout(value)


def test_a_fortran_array_is_stored_as_it_lies_in_memory() -> None:
    """Its bytes are stored as they are (no reordering copy) and come back in Fortran order."""
    f = np.asfortranarray(_BASE)
    blob = codec.encode(f)
    assert f.tobytes(order="F") in blob
    out = codec.decode(blob)
    assert out.flags.f_contiguous and not out.flags.c_contiguous
    np.testing.assert_array_equal(out, _BASE)


def test_a_laid_out_value_decoded_is_private() -> None:
    blob = bytearray(codec.encode({"f": np.asfortranarray(_BASE), "c": _IMG[10:20, 5:9],
                                   "t": _T.contiguous(memory_format=torch.channels_last)}))
    out = codec.decode(blob)
    for v in out.values():
        v[...] = 0
    again = codec.decode(blob)
    np.testing.assert_array_equal(again["f"], _BASE)
    np.testing.assert_array_equal(again["c"], _IMG[10:20, 5:9])
    assert torch.equal(again["t"], _T)


def test_a_laid_out_tensor_with_strides_torch_cannot_have_is_corrupt() -> None:
    blob = bytearray(codec.encode(_T.transpose(0, 1)))
    at = blob.index(b"M") + 1 + 1 + len(b"float32") + 1 + 8 * 4  # the first stride
    blob[at:at + 8] = (-4).to_bytes(8, "little", signed=True)
    with pytest.raises(codec.CorruptEntry):
        codec.decode(blob)


def test_a_sparse_view_of_a_large_array_comes_back_c_ordered_not_in_its_span() -> None:
    # every 100th row and column of a 1000x1000 image: 400 bytes of values spanning 3.6 MB; a
    # hit rebuilt that span (its layout kept) for every read
    big = np.arange(1000 * 1000, dtype=np.float32).reshape(1000, 1000)
    view = big[::100, ::100]
    out = codec.decode(codec.encode(view))
    np.testing.assert_array_equal(out, view)
    assert out.flags.c_contiguous and out.base is None or out.base.nbytes <= 2 * view.nbytes
    t = torch.from_numpy(big)[::100, ::100]
    back = codec.decode(codec.encode(t))
    assert torch.equal(back, t) and back.is_contiguous()
    assert back.untyped_storage().nbytes() == t.numel() * t.element_size()


def _locked(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


READ_ONLY = {
    "locked": _locked(_BASE.copy()),
    "broadcast": np.broadcast_to(np.arange(3.0), (4, 3)),  # laid out (zero strides)
    "frombuffer": np.frombuffer(b"\x01\x02\x03\x04", np.uint8),  # a decode step's output
    "locked fortran": _locked(np.asfortranarray(_BASE)),
}


@pytest.mark.parametrize("name", list(READ_ONLY))
def test_a_read_only_array_comes_back_read_only(name) -> None:
    # a hit came back writeable where the computed sample was not: a later in-place step that
    # raises on a miss succeeded on a hit (a cache hunt's find)
    value = READ_ONLY[name]
    out = codec.decode(codec.encode({"x": value, "w": _BASE}))
    _same(value, out["x"])
    assert _layout(out["x"]) == _layout(value)
    assert not out["x"].flags.writeable
    assert out["w"].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        out["x"][...] = 0


def test_a_writeable_arrays_entry_is_as_an_older_version_wrote_it() -> None:
    # the read-only mark is a prefix only read-only arrays get: entries of writeable arrays
    # (and those already stored) keep their format, and a mark before a non-array is corrupt
    a = np.arange(6, dtype="<i4").reshape(2, 3)
    old = (codec.MAGIC + b"a" + bytes([3]) + b"<i4" + bytes([2]) + (2).to_bytes(8, "little")
           + (3).to_bytes(8, "little") + (24).to_bytes(8, "little") + a.tobytes())
    assert codec.encode(a) == old
    assert codec.decode(old).flags.writeable
    assert codec.encode(_locked(a.copy())) == old[:4] + b"r" + old[4:]
    with pytest.raises(codec.CorruptEntry):
        codec.decode(codec.MAGIC + b"r" + codec.encode(5)[4:])
