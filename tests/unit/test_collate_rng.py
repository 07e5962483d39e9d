"""Where a user collate_fn runs (runtime/collate_rng.py): the decision, and the seeded call."""

import random

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate, default_convert

from headrace.runtime.collate_rng import (
    PROBE_BATCHES,
    CollatePlace,
    collated_in_loop,
    place_for,
)


def test_a_collator_that_never_draws_moves_to_the_threads_after_the_probe():
    place = CollatePlace(len)
    for _ in range(PROBE_BATCHES - 1):
        place.observe(False)
        assert place.mode == "probe"
    place.observe(False)
    assert place.mode == "threads" and "collate thread" in place.describe()


def test_one_draw_keeps_the_collator_in_the_loop_for_good():
    place = CollatePlace(len)
    place.observe(False)
    place.observe(True)
    assert place.mode == "loop"
    for _ in range(2 * PROBE_BATCHES):
        place.observe(False)
    assert place.mode == "loop" and "seeded per batch" in place.describe()


def test_the_decision_is_kept_for_its_function_and_torchs_own_need_none():
    assert place_for(default_collate, None) is None and place_for(default_convert, None) is None
    kept = place_for(len, None)
    assert kept is not None and place_for(len, kept) is kept
    assert place_for(sorted, kept) is not kept  # another collate_fn: decided anew


def test_a_seeded_call_is_a_function_of_its_batch_and_leaves_the_callers_generators_alone():
    def draw():
        return (random.random(), float(np.random.rand()), torch.rand(1).item())

    place = CollatePlace(draw)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    expected_next = draw()
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    a = collated_in_loop(draw, place, 7, 1, 3)
    assert place.mode == "loop"  # it drew, from all three
    assert draw() == expected_next  # the caller's streams as if nothing had been drawn
    assert collated_in_loop(draw, place, 7, 1, 3) == a  # same batch, same draws
    assert collated_in_loop(draw, place, 7, 1, 4) != a  # another batch: others
    assert collated_in_loop(draw, place, 7, 2, 3) != a  # another epoch: others


def test_a_call_that_raises_still_restores_the_callers_generators():
    def boom():
        torch.rand(3)
        raise ValueError("bad batch")

    torch.manual_seed(5)
    expected = torch.rand(1)
    torch.manual_seed(5)
    with pytest.raises(ValueError, match="bad batch"):
        collated_in_loop(boom, CollatePlace(boom), 0, 0, 0)
    assert torch.equal(torch.rand(1), expected)
