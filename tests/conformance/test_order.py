"""Delivery order: in_order=True waits for a slow sample, in_order=False lets later samples
overtake it, and an order the user asked for is kept by default."""

import multiprocessing

import pytest
import torch

from tests.conformance.conftest import flat, is_headrace
from tests.conformance.datasets import Gated

pytestmark = pytest.mark.integration


def gate():
    return multiprocessing.get_context("fork").Event()


@pytest.mark.parametrize("in_order", [False, None])
def test_later_samples_overtake_a_slow_one_when_order_is_not_required(Loader, in_order,
                                                                      no_leaks):
    if in_order is None and not is_headrace(Loader):
        pytest.skip("torch's default is in_order=True")
    g = gate()
    kw = {} if in_order is None else {"in_order": in_order}
    loader = Loader(Gated(12, 0, g), batch_size=1, num_workers=2, shuffle=True,
                    generator=torch.Generator().manual_seed(0), **kw)
    it = iter(loader)
    first = [next(it).item() for _ in range(3)]  # sample 0 is still held at its gate
    g.set()
    rest = flat(it)
    assert 0 not in first
    assert sorted(first + rest) == list(range(12))


@pytest.mark.parametrize("kw", [{"in_order": True}, {}])
def test_a_sequential_order_waits_for_a_slow_sample(Loader, kw, no_leaks):
    """shuffle=False: torch's default keeps the order; headrace's keeps an order the user asked
    for (in_order=None with a sequential sampler). Sample 0 finishes only after sample 3 was
    loaded by the other worker, and is still delivered first."""
    got = flat(Loader(Gated(12, 0, gate(), opener=3), batch_size=2, num_workers=2, **kw))
    assert got == list(range(12))
