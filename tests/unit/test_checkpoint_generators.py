"""Which generators a state dict saves for a sampler (runtime/checkpoint.py)."""

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler

from headrace.errors import StateDictError
from headrace.runtime.checkpoint import sampler_generators, set_states


def test_a_samplers_own_generator_is_found_through_a_batch_sampler():
    g = torch.Generator().manual_seed(1)
    assert sampler_generators(BatchSampler(RandomSampler(range(4), generator=g), 2, False),
                              None) == (g,)


def test_the_loaders_generator_and_the_global_one_are_not_the_samplers_own():
    g = torch.Generator()
    assert sampler_generators(RandomSampler(range(4), generator=g), g) == ()
    # the global generator is the training loop's: a resume must not set it for a sampler
    assert sampler_generators(RandomSampler(range(4), generator=torch.default_generator),
                              None) == ()


def test_a_state_for_a_generator_the_sampler_no_longer_has_is_refused_clearly():
    with pytest.raises(StateDictError, match="when it is built"):
        set_states((), (torch.Generator().get_state(),))
