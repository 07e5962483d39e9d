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
