"""OrderDigest: a resumed epoch's sampler order compared with the saved epoch's (pure)."""

import warnings

import pytest

from headrace.errors import ReplayOrderWarning
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.order_digest import OrderDigest


def read(order, groups, auto=True):
    return list(order.wrap(iter(groups), auto))


def saved_after(groups, upto):
    order = OrderDigest()
    read(order, groups)
    return order.saved(upto)


def test_the_same_order_in_other_batches_compares_equal():
    expect = saved_after([[3, 1, 4], [1, 5, 9]], upto=5)
    assert expect == (6, expect[1])  # the first mark at or past the last delivered position
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read(OrderDigest(expect), [[3, 1], [4, 1], [5, 9, 2, 6]]) == [
            [3, 1], [4, 1], [5, 9, 2, 6]]  # the positions after the saved ones may differ


def test_another_order_warns_once_at_the_saved_positions():
    expect = saved_after([[3, 1], [4, 1]], upto=4)
    order = OrderDigest(expect)
    with pytest.warns(ReplayOrderWarning, match="first 4 positions hold other indices"):
        read(order, [[3, 1], [1, 4], [5, 9], [2, 6]])
    assert order.mismatch


def test_a_replay_shorter_than_the_saved_reads_warns_at_its_end():
    expect = saved_after([[0, 1], [2, 3]], upto=3)
    with pytest.warns(ReplayOrderWarning):
        read(OrderDigest(expect), [[0, 1]])


def test_only_what_was_delivered_is_compared_and_keys_of_any_kind_hash():
    # delivered up to position 2 (of 6 read ahead): the mark after the first element
    expect = saved_after([["a", ("b", 1)], ["c"], ["d"]], upto=2)
    assert expect[0] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read(OrderDigest(expect), [["a", ("b", 1)], ["x"], ["y"]])
    assert saved_after([[1, 2]], upto=0) is None  # nothing delivered: nothing to compare
    single = OrderDigest()
    read(single, [5, 6, 7], auto=False)
    assert single.read == 3


def test_a_resumed_epoch_that_has_not_read_as_far_keeps_the_saved_digest():
    expect = saved_after([[0, 1], [2, 3]], upto=4)
    order = OrderDigest(expect)
    assert next(order.wrap(iter([[0, 1], [2, 3]]), True)) == [0, 1]  # read part-way
    assert order.saved(upto=2) == expect


def test_bitmap_end():
    b = Bitmap()
    assert b.end() == 0
    b.set(0)
    b.set(17)
    assert b.end() == 18
    b.clear(17)
    assert b.end() == 1
