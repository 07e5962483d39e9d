"""A ``DistributedSampler``'s ``seed`` and ``epoch``: recorded at an epoch's start, put back
while a resume replays that epoch's order, so the rest of the epoch comes exactly once whatever
seed the resumed run gives the sampler.

``DistributedSampler`` draws its order in ``__iter__`` from a generator it seeds itself with
``seed + epoch`` (``set_epoch``): no generator state of the loader's or the sampler's holds it,
so a state dict held positions over an order the resume could not replay. Resumed with another
``seed`` (a script drawing one per run, an edited config) or another ``set_epoch`` (a new
process counting epochs from 0), the positions delivered before held other samples: a bug hunt
saw 2 ranks, 3 batches of 4 each out of 40, saved with seed 1 and resumed with seed 2, deliver 6
samples twice and 6 never, with a warning blaming a sampler that draws as it goes.

Now a state dict records each such sampler's ``(seed, epoch)`` at the epoch's start
(``epoch_sampler_seeds``), and the replay of that epoch sets them for ``iter(sampler)`` and its
first read, then gives the script's values back: the rest of the saved epoch comes in the saved
order, each sample once, on the rank that had it; the epochs after it run with the script's seed
and the epochs ``set_epoch`` gives them. A warning says what changed and what happens. (A
sampler's ``generator``, ``RandomSampler(generator=g)``, is a running state and is replayed and
restored by ``checkpoint``; a seed is a setting: the script's, from the next epoch on.)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.utils.data as tud

from headrace.runtime import distributed
from headrace.user_frame import warn

Seeds = tuple[tuple[int, int], ...]
"""``(seed, epoch)`` of each ``DistributedSampler`` under a loader's sampler, outermost first."""


def samplers(index_sampler: Any) -> tuple[tud.distributed.DistributedSampler, ...]:
    """The ``DistributedSampler``s (subclasses too: Lightning's wrapper) ``index_sampler`` is
    or holds, through batch samplers and wrappers (``distributed.nested``)."""
    return tuple(s for s in distributed.nested(index_sampler)
                 if isinstance(s, tud.distributed.DistributedSampler))


def capture(index_sampler: Any) -> Seeds | None:
    """Their ``(seed, epoch)`` now (empty: none); ``None`` where one is not an integer (a
    subclass of its own kind: nothing that could be put back)."""
    try:
        return tuple((_int(s.seed), _int(s.epoch)) for s in samplers(index_sampler))
    except (AttributeError, TypeError, ValueError):
        return None


def _int(v: Any) -> int:
    if isinstance(v, bool) or int(v) != v:
        raise TypeError(v)
    return int(v)


@contextmanager
def replaying(index_sampler: Any, saved: Seeds | None, epoch: int) -> Iterator[None]:
    """The saved epoch's ``(seed, epoch)`` in place while its order is drawn again (the
    script's put back after), with a warning naming any that changed on a shuffling sampler.
    ``saved`` ``None`` (a state dict of a headrace that did not record them) or for another
    number of samplers: nothing is set (``order_digest`` warns if the order differs)."""
    ss = samplers(index_sampler)
    now = capture(index_sampler)
    if saved is None or now is None or len(saved) != len(ss):
        yield
        return
    if now != saved:
        message = _changed(ss, saved, now, epoch)
        if message:
            warn(message)
    theirs = [(s.seed, s.epoch) for s in ss]
    for s, (seed, ep) in zip(ss, saved, strict=True):
        s.seed, s.epoch = seed, ep
    try:
        yield
    finally:
        for s, (seed, ep) in zip(ss, theirs, strict=True):
            s.seed, s.epoch = seed, ep


def _changed(ss: tuple[Any, ...], saved: Seeds, now: Seeds, epoch: int) -> str | None:
    """The warning for a replay under other values, or ``None`` where no changed sampler
    shuffles (its order does not depend on them)."""
    what = []
    for s, (seed, ep), (seed_now, ep_now) in zip(ss, saved, now, strict=True):
        if not s.shuffle:
            continue
        if seed_now != seed:
            what.append(f"seed={seed_now} now, {seed} when the state dict was saved")
        if ep_now != ep:
            what.append(f"set_epoch({ep_now}) now, set_epoch({ep}) when it was saved")
    if not what:
        return None
    first = saved[0]
    return (
        f"headrace: resuming epoch {epoch} part-way with another DistributedSampler order ("
        + "; ".join(what) + "): its order is drawn from seed + epoch, so in this run's order "
        "the positions delivered before hold other samples. The rest of the saved epoch comes "
        f"in the saved order (seed={first[0]}, set_epoch({first[1]})), each of its samples "
        f"exactly once on the rank that had it; the epochs after it use this sampler's "
        f"seed={now[0][0]} and the epochs set_epoch gives them")


def unrecorded(index_sampler: Any, saved: Seeds | None) -> str | None:
    """What to blame when a resumed epoch's order differs and the state dict did not record
    the ``DistributedSampler``'s seed and epoch (``saved`` ``None``: an older headrace's, or
    :func:`capture` found one that is not an integer) while
    this loader has a shuffling one; ``None`` otherwise."""
    if saved is not None or not any(s.shuffle for s in samplers(index_sampler)):
        return None
    return ("This state dict does not record the DistributedSampler's seed and epoch (saved "
            "by an older headrace, or a sampler whose seed or epoch is not an integer), whose "
            "order is drawn from seed + epoch: resume with the saved run's seed and "
            "set_epoch(epoch) to finish that epoch exactly")


def to_list(seeds: Seeds | None) -> list[list[int]] | None:
    """For the state dict (JSON friendly)."""
    return [list(p) for p in seeds] if seeds is not None else None


def from_list(saved: Any) -> Seeds | None:
    """A state dict's ``epoch_sampler_seeds`` (absent in those saved before it: ``None``)."""
    if saved is None:
        return None
    return tuple((int(seed), int(ep)) for seed, ep in saved)
