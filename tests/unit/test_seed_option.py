"""``Options(seed=)`` and torch's ``generator=`` keyword given together
(``runtime/loader_arguments.py``'s ``loader_generator``): the generator is the loader's, and a
warning says that the seed is not used, where they differ; a loader rebuilt from its attributes
(the generator its seed made, and its options) warns nothing. In the training process (no workers)."""

from __future__ import annotations

import warnings

import pytest
import torch

import headrace as hr


def order(**kw) -> list[int]:
    loader = hr.DataLoader(list(range(10)), batch_size=5, shuffle=True, in_order=True, **kw)
    return torch.cat(list(loader)).tolist()


def test_seed_and_a_generator_with_another_seed_warn_that_the_generator_wins():
    with pytest.warns(UserWarning, match=r"Options\(seed=7\) and generator= \(seeded with 1\).*"
                                         r"generator= keyword is the loader's generator") as caught:
        got = order(generator=torch.Generator().manual_seed(1), options=hr.Options(seed=7))
    assert len([w for w in caught if "Options(seed=" in str(w.message)]) == 1
    assert got == order(generator=torch.Generator().manual_seed(1))  # the generator's order

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seeded = hr.DataLoader(list(range(10)), batch_size=5, shuffle=True,
                               options=hr.Options(seed=-3))
        # the same seed both ways, and a rebuild from the attributes (Lightning, Accelerate)
        hr.DataLoader(list(range(10)), generator=torch.Generator().manual_seed(7),
                      options=hr.Options(seed=7))
        hr.DataLoader(seeded.dataset, batch_size=5, shuffle=True, generator=seeded.generator,
                      options=seeded.options)
