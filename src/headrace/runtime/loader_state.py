"""A map-style loader's ``state_dict()`` and ``load_state_dict()`` (``DataLoader``'s methods say
what they promise); an ``IterableDataset``'s are ``runtime/iterable_dataset.py``'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.pipeline.fingerprint import source_fingerprint, step_digests
from headrace.runtime import (
    checkpoint,
    epochs,
    iterable_dataset,
    ordering,
    padding,
    ranks,
    state_checks,
)
from headrace.runtime import span as epoch_span
from headrace.runtime.lightning_loops import restored_at_epoch_end, unloaded_state

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader


def save(loader: DataLoader) -> dict[str, Any]:
    """``loader.state_dict()``."""
    if loader.pipeline is None:  # an IterableDataset: no position (iterable_dataset.py)
        return iterable_dataset.state(loader, loader._torch_iter_ref())
    assert loader.planning is not None
    it = loader._iterator_ref()
    steps = loader.planning.executed_names
    phase: str | None = loader.planning.phase
    empty = batches = 0
    read: int | None = None
    last: Any = None
    # (a DDP rank's epoch whose own batches are all out still owes its padding: not over yet)
    if it is not None and (not it.closed or epoch_span.batches_owed(it)) \
            and not epoch_span.at_end(loader, it):
        origin, delivered, epoch, steps = it.origin, it.delivered, it.origin.epoch, it.steps
        empty, batches = it.empty_batches, it.batches_delivered or 0
        read = epoch_span.positions_read(it)  # (after at_end: its read of the end counts)
        last = padding.last_keys(loader._epoch_ref())
    elif loader._resume is not None or loader._unfinished is not None:
        point = loader._resume if loader._resume is not None else loader._unfinished
        assert point is not None
        origin, delivered, epoch = point.origin, point.delivered, point.epoch
        steps, empty, batches = point.steps or steps, point.empty_batches, point.batches
        phase, read, last = point.order_phase or phase, point.positions_read, point.last_batch
    else:  # between epochs: the order the next one runs, as the uninterrupted run would
        origin, delivered, epoch = None, None, loader._epoch
        steps, phase = loader.planning.upcoming()
    persistent = loader._base_seed if loader.persistent_workers else None
    state = checkpoint.build(identity(loader, steps), epoch, origin, delivered, loader.generator,
                             persistent, checkpoint.sampler_generators(loader._index_sampler,
                                                                       loader.generator), empty,
                             batches, phase, read, last)
    state["persistent_workers"] = bool(loader.persistent_workers)  # (state_checks: seeding)
    return ranks.gathered(state, ranks.shard(loader._index_sampler))  # DDP: whose it is


def load_unloaded(loader: DataLoader) -> None:
    """At ``iter(loader)``: load the state a Lightning checkpoint holds for it that Lightning
    itself will not load (``lightning_loops.unloaded_state``)."""
    found = unloaded_state(loader)
    if found is not None:
        load(loader, found[0], ended=found[1])


def load(loader: DataLoader, state: dict[str, Any], ended: bool = False) -> None:
    """``loader.load_state_dict(state)``; ``ended``: the training loop ended the state's epoch
    where it was taken (as ``restored_at_epoch_end`` tells of Lightning's own load)."""
    if loader.pipeline is None or loader.planning is None:
        iterable_dataset.load(loader, state)
        return
    iterable_dataset.refuse_iterable_state(state)
    state = ranks.own(state, ranks.shard(loader._index_sampler))  # DDP: this rank's
    point = checkpoint.parse(state, identity(loader, loader.planning.executed_names))
    state_checks.warn_seeding_changes(
        state, loader.persistent_workers,
        "The rest of the saved epoch is restored exactly; the epochs after it" if point.in_epoch
        else "The next epochs")
    if point.in_epoch and (ended or restored_at_epoch_end()):  # Lightning ended that epoch there
        point = checkpoint.epoch_over(point)
    it = loader._iterator_ref()
    epoch_span.halt_unfinished(loader, loader._epoch_ref(),
                               "load_state_dict() gave the DataLoader another position",
                               "a new iter(loader) delivers what the loaded state dict left")
    if it is not None:
        it.close()
    loader._unfinished = None
    if point.steps is not None:  # mid-epoch: that epoch's order; between: the next one's
        loader.planning.restore(point.steps, point.order_phase)
    loader._epoch = point.epoch
    if point.persistent_base_seed is not None:
        loader._base_seed = point.persistent_base_seed
    if not point.in_epoch and point.generator_state is not None and loader.generator is not None:
        loader.generator.set_state(point.generator_state)
    if not point.in_epoch and point.sampler_generator_states:  # (mid-epoch: the replay sets them)
        checkpoint.set_states(checkpoint.sampler_generators(loader._index_sampler, loader.generator),
                              point.sampler_generator_states)
    loader._resume = point if point.in_epoch else None


def identity(loader: DataLoader, steps: tuple[str, ...]) -> checkpoint.Identity:
    """What a state dict records of the loader, to tell whether a resume delivers the same
    samples (``checkpoint.Identity``); ``steps``: the executed step order, by name."""
    assert loader.pipeline is not None
    batch_size, drop_last = epoch_span.batching(loader)
    return checkpoint.Identity(
        samples=loader.pipeline.length(), batches=epoch_span.length_or_none(loader), steps=steps,
        dataset=source_fingerprint(loader.pipeline.source),
        step_code=step_digests(loader.pipeline),
        delivered_by="index" if epochs.delivered_by_index(loader) else "position",
        positions=epoch_span.total_positions(loader), batch_size=batch_size, drop_last=drop_last,
        shuffle=ordering.shuffle_of(loader._index_sampler))
