"""How many times a sampler key came before in an epoch (runtime/draws.py): pure."""

import numpy as np
import torch
import torch.utils.data as tud

from headrace.runtime.draws import BITMAP_LIMIT, Draws, may_repeat


def test_the_first_time_is_draw_0_and_each_repeat_counts_on():
    d = Draws()
    assert [d.next(i) for i in [3, 1, 3, 3, 0, 1]] == [0, 0, 1, 2, 0, 1]


def test_integers_of_numpy_and_torch_are_their_index_and_other_keys_their_own():
    d = Draws()
    assert [d.next(k) for k in [5, np.int64(5), torch.tensor(5)]] == [0, 1, 2]
    keys = ["a", ("a", 1), [0, 1], -1, BITMAP_LIMIT + 3, 2**70]
    assert [d.next(k) for k in keys] == [0] * len(keys)
    assert [d.next(k) for k in keys] == [1] * len(keys)
    assert d.next("b") == 0 and d.next([1, 0]) == 0


def test_a_group_gives_the_positions_of_its_repeats():
    d = Draws()
    assert d.repeats(range(0, 4), [3, 1, 3, 3]) == {2: 1, 3: 2}
    assert d.repeats(range(4, 6), [1, 5]) == {4: 1}


def test_only_samplers_that_may_repeat_an_index_are_counted():
    data = range(10)
    assert not may_repeat(tud.SequentialSampler(data), False)  # shuffle=False
    assert not may_repeat(tud.RandomSampler(data), False)  # shuffle=True
    assert may_repeat(tud.RandomSampler(data, replacement=True), False)
    assert may_repeat(tud.WeightedRandomSampler([1.0] * 10, 10), False)
    assert may_repeat([3, 3, 1], False) and may_repeat(tud.SequentialSampler(data), True)
    off = Draws(counting=False)  # nothing remembered: every draw 0
    assert off.repeats(range(3), [3, 3, 3]) == {} and off.next(3) == 0
