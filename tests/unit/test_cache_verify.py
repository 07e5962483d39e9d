"""A checked hit is compared with its stored form by value (``cache/verify.py``): a dict's key
order, which follows each process's string-hash seed for keys from a set, is not a difference;
every difference in what a sample holds is, and its place is named."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headrace.cache import codec
from headrace.cache.verify import Check


def _check(stored: object, computed: object) -> Check:
    c = Check("decoded", 0, codec.encode(stored))
    c.compare(computed)
    return c


def test_a_dict_in_another_key_order_is_the_same_value() -> None:
    stored = {"image": np.arange(6, dtype=np.float32).reshape(2, 3), "meta": {"a": 1, "b": [2.5]}}
    computed = {"meta": {"b": [2.5], "a": 1}, "image": stored["image"].copy()}
    assert codec.encode(stored) != codec.encode(computed)  # the bytes follow the key order
    c = _check(stored, computed)
    assert (c.same, c.where) == (True, "")


NAN = np.array([np.nan, 1.0])


@pytest.mark.parametrize(("stored", "computed", "where"), [
    ({"boxes": [0, 1, 2, np.zeros(4, np.float32)], "x": 1},
     {"x": 1, "boxes": [0, 1, 2, np.array([0, 0, 1, 0], np.float32)]},
     "value['boxes'][3]: 1 of 4 elements differ (float32, shape (4,))"),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1, "c": 3}, "value: key 'c' only in the computed form"),
    ({"a": [1, 2]}, {"a": (1, 2)}, "value['a']: type list stored, tuple computed"),
    ({"a": True}, {"a": 1}, "value['a']: type bool stored, int computed"),
    ({"a": 0.0}, {"a": -0.0}, "value['a']: 0.0 stored, -0.0 computed"),
    ([1, 2], [1, 2, 3], "value: 2 items stored, 3 computed"),
    (np.zeros(3, "<f4"), np.zeros(3, ">f4"), "value: dtype float32 stored, >f4 computed"),
    (torch.zeros(2, 3), torch.zeros(3, 2), "value: shape (2, 3) stored, (3, 2) computed"),
    (torch.zeros(3, dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16),
     "value: 3 of 3 elements differ (bfloat16, shape (3,))"),
])
def test_a_difference_is_found_and_named(stored, computed, where) -> None:
    c = _check(stored, computed)
    assert (c.same, c.where) == (False, where)


def test_a_computed_form_that_does_not_encode_differs() -> None:
    c = _check({"k": 1}, {"k": object()})
    assert c.same is False and "the computed form cannot be stored" in c.where


@pytest.mark.parametrize("computed", [NAN.copy(), np.asfortranarray(np.zeros((3, 4)))])
def test_nan_bits_and_a_layout_are_not_differences(computed) -> None:
    stored = NAN.copy() if computed.ndim == 1 else np.zeros((3, 4))
    c = _check({"x": stored, "y": 1}, {"y": 1, "x": computed})
    assert (c.same, c.where) == (True, "")
