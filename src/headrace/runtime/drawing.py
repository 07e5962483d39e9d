"""An epoch's sampler stream and base seed, drawn in torch's order (``iter(loader)``,
``runtime/epochs.py``): the sampler iterator, then the base seed, then the sampler's first
element (at ``iter()`` with workers, at the first ``next()`` without, as torch reads it), and
the same draws replayed from a saved epoch's RNG states (exact resume)."""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from headrace.errors import StateDictError
from headrace.runtime import host_rngs, sampler_seeds
from headrace.runtime.checkpoint import (
    EpochOrigin,
    FirstRead,
    capture_rng,
    sampler_generators,
    set_states,
)

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader

_END = object()


def draw_epoch(
    loader: DataLoader, replay: EpochOrigin | None = None
) -> tuple[EpochOrigin, Iterator[Any]]:
    """Sampler stream and base seed, drawing random numbers in torch's own order.

    With workers the sampler's first element is taken here, in the training thread, as
    torch's ``_reset`` primes its workers at ``iter()``: samplers draw their permutation
    lazily from the RNG, and done later in the scheduler thread it would race the training
    loop's own use of torch's global generator. Without workers torch reads it at the first
    ``next()``: so does headrace (:class:`FirstAtNext`), so a draw the training loop makes
    between ``iter()`` and that ``next()`` (a model built there) comes before the order's, as
    in torch. The base seed is drawn here either way, as torch's iterator does.
    ``replay`` redraws a saved epoch from its saved RNG state (exact resume), reading the
    first element here, while that state is in place. Python's and NumPy's global generators
    are watched over the read and replayed where it moved them (``runtime/host_rngs.py``).
    """
    user_rng = None
    own = sampler_generators(loader._index_sampler, loader.generator)
    if replay is not None and replay.sampler_rngs:
        set_states(own, replay.sampler_rngs)  # (raises for a sampler built otherwise)
    user_host = host_rngs.snapshot() if replay is not None else None
    if replay is not None:
        host_rngs.put(replay.host_rngs)
    if replay is not None:
        if loader.generator is not None:
            loader.generator.set_state(replay.rng)
        global_rng = replay.rng if loader.generator is None else replay.global_rng
        if global_rng is not None:  # a sampler without a generator of its own draws from it
            user_rng = torch.get_rng_state()
            torch.set_rng_state(global_rng)
        if not replay.drew_base_seed:
            loader._base_seed = replay.base_seed
    seeds = contextlib.ExitStack()  # a DistributedSampler's seed and epoch, replayed
    try:
        if replay is not None:
            seeds.enter_context(sampler_seeds.replaying(loader._index_sampler,
                                                        replay.sampler_seeds, replay.epoch))
        before = host_rngs.snapshot()
        rng = capture_rng(loader.generator)
        glob = torch.get_rng_state() if loader.generator is not None else None
        sampler_rngs = tuple(g.get_state() for g in own)
        seeded = sampler_seeds.capture(loader._index_sampler)
        sampler_iter = iter(loader._index_sampler)
        # a replayed epoch draws what it drew then: the base seed a resumed persistent loader
        # already holds (state_dict's persistent_base_seed) was drawn by that very epoch when
        # it was the first, and not drawing it moved the sampler's draws (wrong samples)
        drew = (replay.drew_base_seed if replay is not None
                else loader._base_seed is None or not loader.persistent_workers)
        if drew:
            loader._base_seed = int(
                torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
            )
        if replay is None and loader.num_workers == 0:
            assert loader._base_seed is not None
            origin = EpochOrigin(loader._epoch, rng, loader._base_seed, drew, sampler_rngs, glob,
                                 host_rngs=host_rngs.moved_since(before), sampler_seeds=seeded)
            return origin, FirstAtNext(sampler_iter, loader.generator, own)
        first_read = replay.first_read if replay is not None else None
        if first_read is not None:  # the saved epoch read its first element later (at next())
            _set_read_states(loader, own, first_read)
        first = next(sampler_iter, _END)
        host = replay.host_rngs if replay is not None else host_rngs.moved_since(before)
    finally:
        seeds.close()  # the script's seed and epoch back, for the epochs after this one
        if user_rng is not None:
            torch.set_rng_state(user_rng)  # the training loop's RNG is not ours to move
        host_rngs.give_back(user_host)  # nor its Python and NumPy ones
    assert loader._base_seed is not None
    if replay is not None and loader._base_seed != replay.base_seed:
        raise StateDictError(
            "replaying the saved epoch drew another base seed: the sampler or generator "
            "does not reproduce its order from the saved RNG state"
        )
    origin = EpochOrigin(loader._epoch, rng, loader._base_seed, drew, sampler_rngs, glob,
                         first_read, host, sampler_seeds=seeded)
    groups = sampler_iter if first is _END else _after(first, sampler_iter)
    return origin, groups


def _set_read_states(loader: DataLoader, own: tuple[torch.Generator, ...],
                     first_read: FirstRead) -> None:
    """Put in place the RNG states a saved epoch's first read drew from (its caller restores
    the training loop's global states afterwards)."""
    set_states(own, first_read.sampler_rngs)
    host_rngs.put(first_read.host_rngs)
    if loader.generator is not None:
        loader.generator.set_state(first_read.rng)
        if first_read.global_rng is not None:
            torch.set_rng_state(first_read.global_rng)
    else:
        torch.set_rng_state(first_read.rng)


class FirstAtNext:
    """A sampler iterator read from its first ``next()`` on: the epoch without workers, whose
    first read torch makes at the first ``next(loader)``, not at ``iter()``.

    Its first ``next()`` calls ``on_first`` with the RNG states that read draws from (the
    loader's generator or the global one, the sampler's own generators): the epoch's origin
    keeps them as its ``first_read``, so a resume replays ``iter(sampler)`` from the states of
    ``iter()`` (a sampler drawing its order in ``__iter__`` drew there) and the first read
    from these (a lazy one draws there; the training loop may have drawn between the two).
    Only ``next()``, never ``iter()`` again (see :func:`_after`)."""

    def __init__(self, sampler_iter: Iterator[Any], generator: torch.Generator | None,
                 own: tuple[torch.Generator, ...]) -> None:
        self._it: Iterator[Any] = sampler_iter
        self._generator = generator
        self._own = own
        self.on_first: Callable[[Callable[[EpochOrigin], EpochOrigin]], None] | None = None

    def __iter__(self) -> FirstAtNext:
        return self

    def __next__(self) -> Any:
        on_first, self.on_first = self.on_first, None
        if on_first is None:
            return next(self._it)
        rng = capture_rng(self._generator)
        glob = torch.get_rng_state() if self._generator is not None else None
        sampler_rngs = tuple(g.get_state() for g in self._own)
        before = host_rngs.snapshot()
        try:
            return next(self._it)
        finally:  # (Python's and NumPy's kept where the read moved them)
            read = FirstRead(rng, sampler_rngs, glob, host_rngs.moved_since(before))
            on_first(lambda o: dataclasses.replace(o, first_read=read))


def skip_empty(groups: Iterator[Any], n: int, loader: DataLoader) -> Iterator[Any]:
    """``groups`` less its first ``n`` empty batches (a batch sampler's ``[]``, which a resumed
    epoch delivered before: they have no position for the delivered bitmap to hold)."""
    if n <= 0 or not loader._auto_collation:
        return groups
    return _skipping_empty(groups, n)


def _skipping_empty(groups: Iterator[Any], n: int) -> Iterator[Any]:
    while True:  # next() only, never iter() again (see _after)
        try:
            group = next(groups)
        except StopIteration:
            return
        if n > 0:
            group = list(group)  # a batch sampler may yield generators: read once
            if not group:
                n -= 1
                continue
        yield group


def _after(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    """``first``, then what ``next(rest)`` gives. Never ``iter(rest)`` again (as
    ``itertools.chain`` and ``yield from`` do): a sampler whose ``__iter__`` returns itself
    and starts over (Lightning's ``_IndexBatchSamplerWrapper`` under ``trainer.predict``)
    would restart the epoch, repeating its first batch."""
    yield first
    while True:
        try:
            item = next(rest)
        except StopIteration:
            return
        yield item


def origin_setter(ref: weakref.ref[Any]) -> Callable[[Callable[[EpochOrigin], EpochOrigin]], None]:
    """A :attr:`FirstAtNext.on_first` for the epoch iterator ``ref`` refers to: its
    ``origin`` becomes what the callback's argument makes of it (weakly: the epoch holds the
    sampler stream, which holds this)."""
    def change(how: Callable[[EpochOrigin], EpochOrigin]) -> None:
        it = ref()
        if it is not None and it.origin is not None:
            it.origin = how(it.origin)
    return change
