"""Which batching a loader uses: torch's order, or sample-aware regrouping (pure).

Sample-aware batching (MinatoLoader) changes which samples share a batch and the order batches
come in. Where the sampler's order is random anyway, nothing a user relies on changes; where the
user asked for an order (``shuffle=False``, a sequential or custom sampler), an evaluation loop
may line predictions up with dataset order, so that order is kept unless ``in_order=False`` is
passed explicitly.
"""

from __future__ import annotations

from typing import Any

import torch.utils.data as tud

from headrace.pipeline.source import user_attr
from headrace.runtime.batcher import Mode

_RANDOM_SAMPLERS = (tud.RandomSampler, tud.SubsetRandomSampler, tud.WeightedRandomSampler)


def is_random_sampler(sampler: Any) -> bool:
    """True when ``sampler`` draws a random order: torch's random samplers, a
    ``DistributedSampler(shuffle=True)``, or a ``BatchSampler`` over one of those. Unknown
    samplers count as ordered (keeping their order is always safe)."""
    if isinstance(sampler, tud.BatchSampler):  # a subclass may have none (Accelerate's shards)
        inner = user_attr(sampler, "sampler")
        return inner is not None and is_random_sampler(inner)
    if isinstance(sampler, _RANDOM_SAMPLERS):
        return True
    if isinstance(sampler, tud.distributed.DistributedSampler):
        return bool(sampler.shuffle)
    return False


def shuffle_of(index_sampler: Any) -> bool | None:
    """torch's ``shuffle`` as the sampler of a loader's order says it: ``True`` for a
    ``RandomSampler`` and ``False`` for a ``SequentialSampler`` (what ``shuffle=`` builds, also
    under a ``BatchSampler``), a ``DistributedSampler``'s own ``shuffle``; ``None`` for any
    other sampler (also a ``BatchSampler`` subclass without a ``sampler``)."""
    s = (user_attr(index_sampler, "sampler") if isinstance(index_sampler, tud.BatchSampler)
         else index_sampler)
    if isinstance(s, tud.RandomSampler):
        return True
    if isinstance(s, tud.SequentialSampler):
        return False
    if isinstance(s, tud.distributed.DistributedSampler):
        return bool(s.shuffle)
    return None


def batch_mode(
    in_order: bool | None, index_sampler: Any, auto_collation: bool, user_batch_sampler: bool
) -> Mode:
    """The batcher mode (``runtime/batcher.py``) for a loader's arguments.

    ``in_order=True``: torch's order and batches. ``False``: sample-aware (the next samples to
    finish form the next batch; a user ``batch_sampler``'s batches are kept whole but yielded
    as soon as complete). ``None`` (the default): sample-aware where the sampler is random,
    torch's order otherwise.
    """
    if in_order is None:
        in_order = not is_random_sampler(index_sampler)
    if in_order:
        return "ordered"
    if auto_collation and not user_batch_sampler:
        return "regroup"
    return "grouped"


def describe(mode: Mode, in_order: bool | None, ods: bool = False) -> str:
    """One line for ``explain()``: which batching applies, and why. ``ods``: the cache's
    opportunistic sampling fills positions with other samples (``Cache(ods=True)``)."""
    if in_order is None:
        why = "in_order=None: the sampler's order is " + (
            "random" if mode != "ordered" else "not random, so it is kept")
    else:
        why = f"in_order={in_order}"
    if mode == "ordered" and ods:
        return (f"the sampler's order, its positions filled by ODS: another sample may take a "
                f"position, so not torch's batches ({why})")
    if mode == "ordered":
        return f"torch's order and batches ({why})"
    if mode == "grouped":
        return f"the batch sampler's batches, each yielded as soon as it is complete ({why})"
    return f"sample-aware: batches filled by the first samples to finish ({why})"
