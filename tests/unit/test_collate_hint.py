"""A collation error names the sample that differs from the batch's first, and only then
(``runtime/work.py``: ``collate_error``, ``sample_difference``)."""

import dataclasses
from collections import namedtuple

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from headrace.runtime.work import collate_error, sample_difference

Pair = namedtuple("Pair", "image label")


@dataclasses.dataclass
class Record:
    x: int


def error_of(collate, samples):
    indices = list(range(10, 10 + len(samples)))
    try:
        collate(samples)
    except Exception as e:  # noqa: BLE001 - what a loader catches
        return collate_error(e, indices, samples)
    raise AssertionError("collated")


@pytest.mark.parametrize("make", [
    lambda i: None, lambda i: {i}, lambda i: Record(i), lambda i: complex(i, 1),
    lambda i: 2**70, lambda i: torch.eye(2).to_sparse(), lambda i: (i, None),
])
def test_samples_that_all_agree_get_no_hint(make):
    # default_collate refuses them all alike: "a sample of another shape or type than the
    # others is the usual cause" was added to every collation error (a bug hunt's find)
    err = error_of(default_collate, [make(i) for i in range(3)])
    assert str(err).split("\n")[0].endswith("(batch of sample indices [10, 11, 12])")


def test_a_collate_fn_that_is_not_callable_gets_no_hint():
    err = error_of(3, [0, 1])  # collate_fn=3: torch's TypeError, in torch's words
    assert isinstance(err, TypeError)
    assert "'int' object is not callable (batch of sample indices [10, 11])" in str(err)


@pytest.mark.parametrize("samples, words", [
    ([torch.zeros(2), torch.zeros(2), torch.zeros(3)],
     "sample index 12 has shape (3,) where sample index 10 has (2,)"),
    ([(np.zeros((2, 2)), 0), (np.zeros((2, 3)), 1)],
     "sample index 11 has shape (2, 3) at [0] where sample index 10 has (2, 2)"),
    ([{"t": torch.zeros(2), "y": 0}, {"t": torch.zeros(2), "y": None}],
     "sample index 11 has type NoneType at ['y'] where sample index 10 has int"),
    ([{"a": 0, "b": 1}, {"a": 1}], "sample index 11 has keys ['a'] where sample index 10 has "
                                   "['a', 'b']"),
    ([[0], [0, 1]], "sample index 11 has length 2 where sample index 10 has 1"),
    ([Pair(torch.zeros(1), 0), Pair(torch.zeros(1), "x")],
     "sample index 11 has type str at [1] where sample index 10 has int"),
    ([torch.tensor(0), 1], "sample index 11 has type int where sample index 10 has Tensor"),
])
def test_the_sample_that_differs_is_named_with_where_and_how(samples, words):
    err = error_of(default_collate, samples)
    assert str(err).split("\n")[0].endswith(f"(batch of sample indices "
                                            f"[{', '.join(str(10 + i) for i in range(len(samples)))}]; "
                                            f"{words})")


def test_numbers_and_dtypes_that_torch_mixes_are_not_differences():
    # torch.tensor takes ints, floats and bools together; torch.stack promotes dtypes
    assert sample_difference([1, 2.5, True, np.float32(1)], [0, 1, 2, 3]) is None
    assert sample_difference([torch.zeros(2), torch.zeros(2, dtype=torch.int64)], [0, 1]) is None
    assert sample_difference([[1], [1]], [0, 1]) is None


def test_the_look_at_large_samples_is_bounded():
    # a deep, wide sample compares at most _LOOK_VALUES values: a difference beyond goes unseen
    wide = [[[[0] * 64] * 64] * 64, [[[0] * 64] * 64] * 64]
    other = [[[[0] * 64] * 64] * 64, [[[0] * 64] * 64] * 63]
    assert sample_difference([wide, other], [0, 1]) is None
    assert sample_difference([[0, [1]], [0, [1, 2]]], [0, 1]) is not None
