"""A DDP rank's padding (``on_error="skip"``): what its epoch owes, what it paid, and the batch
it repeats when this process yielded none (``runtime/distributed.py``'s ``EvenBatches`` yields
them; docs/design.md, "Data-parallel ranks").

Every rank takes ``len(loader)`` batches an epoch; a rank whose skipped samples left it short
repeats its last batch. The debt is part of the epoch: a state dict taken while padding is
owed is a state inside that epoch (``span.at_end``), its ``batches_delivered`` counts the
padding paid, and it records the positions of the last batch delivered (``last_batch``). A
resumed epoch that delivers nothing more (the rest of it was skipped) then repeats that batch
by running its samples again, in the training process, with their seeds (base seed, epoch,
index, draw): the content an uninterrupted run repeats. Padding never marks a sample
delivered: exactly once holds for the rank's own samples, as torch's ``DistributedSampler``
pads with repeated samples outside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from headrace.errors import UnevenRanksError, message_of, step_error_for
from headrace.pipeline.runner import SampleRunner
from headrace.pipeline.seeding import global_states, restore_globals
from headrace.runtime import python_draws
from headrace.runtime.draws import Draws


class Padding:
    """One epoch's padding on a rank whose epochs are padded to ``to`` batches
    (``len(loader)``)."""

    def __init__(self, to: int, last: Sequence[int] | None = None,
                 watch: LastBatchIndices | None = None) -> None:
        self.to = to  # batches every rank takes this epoch
        self.paid = 0  # padding batches yielded in this process (before a resume: in
        # ``EpochBase.batches_before``, which the state dict's batches_delivered counts)
        self.last: Sequence[int] | None = last  # delivered-bitmap keys of the last batch
        # delivered (positions; ODS: indices), this process's or the saved epoch's
        self.watch = watch  # a resumed epoch's (index, draw) of those positions, as read

    def owed(self, batches: int | None) -> int:
        """Batches still owed, padding included, by an epoch that delivered ``batches`` (padding
        paid included; ``None``: unknown, as in a state dict counted in other batch settings:
        0, nothing is padded on a guess)."""
        return 0 if batches is None else max(0, self.to - batches)


def paid(loader: Any, epoch: Any) -> None:
    """A padding batch of ``epoch`` was yielded: the loader's record of the epoch, made when its
    own batches ended (``EpochBase.close``: the padding still owed), counts it, and is dropped
    once nothing is owed (the epoch is over then). A state dict taken after the loop was left
    reads that record once the padding wrapper is gone: it said "between epochs", the padding
    owed lost, when the garbage collector had taken the wrapper (a review)."""
    point = getattr(loader, "_unfinished", None)
    if point is None or epoch.origin is None or point.origin is not epoch.origin:
        return
    if not epoch.batches_owed:
        loader._unfinished = None
    else:
        loader._unfinished = dataclasses.replace(point, batches=epoch.batches_delivered or 0)


def last_keys(epoch: Any) -> tuple[int, ...] | None:
    """What a state dict records of ``epoch``'s last batch delivered: its keys where the epoch
    is padded (a DDP rank's, with ``on_error="skip"``), else ``None``."""
    pad = getattr(epoch, "padding", None)
    return tuple(int(k) for k in pad.last) if pad is not None and pad.last is not None else None


def owed_at_resume(length: int | None, padded: bool, delivered: int, batches: int) -> int:
    """Padding a saved epoch still owes: ``length`` batches every rank takes (None: unknown),
    ``padded``: whether this loader pads its epochs, ``delivered``: positions the state dict
    records, ``batches``: batches it counted (padding paid included; 0 with positions
    delivered: not counted in this loader's batch settings, so unknown)."""
    if not padded or length is None or (delivered and not batches):
        return 0
    return max(0, length - batches)


class LastBatchIndices:
    """A resumed epoch's sampler elements, read through: the dataset index and draw
    (``runtime/draws.py``) of each of ``positions`` (the saved epoch's last batch), as the
    replay reads them. The positions are counted as the epoch counts them (one per index)."""

    def __init__(self, groups: Iterator[Any], positions: Sequence[int], auto_collation: bool,
                 may_repeat: bool) -> None:
        self._groups = groups
        self._wanted = frozenset(positions)
        self._auto = auto_collation
        self._draws = Draws(may_repeat)
        self._read = 0
        self.found: dict[int, tuple[Any, int]] = {}  # position -> (index, draw)

    def __iter__(self) -> LastBatchIndices:
        return self

    def __next__(self) -> Any:
        group = next(self._groups)
        indices = list(group) if self._auto else [group]
        positions = range(self._read, self._read + len(indices))
        self._read += len(indices)
        draws = self._draws.repeats(positions, indices)
        if self._wanted and len(self.found) < len(self._wanted):
            for p, i in zip(positions, indices, strict=True):
                if p in self._wanted:
                    self.found[p] = (i, draws.get(p, 0))
        return indices if self._auto else group


def rerun(loader: Any, epoch: Any, pad: Padding) -> Any:
    """The saved epoch's last batch again, its samples run in this process with their own
    seeds, collated (and pinned or copied to the device) as the loader does. Raises
    :class:`UnevenRanksError` where it cannot be (nothing delivered in the epoch; under ODS,
    whose keys do not say which draw filled a position)."""
    keys = pad.last
    found = pad.watch.found if pad.watch is not None else {}
    if not keys or any(k not in found for k in keys):
        raise UnevenRanksError(no_batch_message(loader, epoch, pad))
    assert loader.planning is not None
    pipeline = loader.planning.executed
    runner = SampleRunner(pipeline, python_draws=python_draws.known(pipeline))
    origin = epoch.origin
    samples = []
    for k in keys:
        index, draw = found[k]
        state = global_states()
        try:
            out = runner.run(index, 0, None, origin.base_seed, origin.epoch, draw=draw)
        finally:
            restore_globals(state)
        if out.error is not None:  # it ran before the resume: the step is not deterministic
            step, exc, tb = out.error
            raise step_error_for(type(exc), index, runner.names[step], type(exc).__qualname__,
                                 message_of(exc), tb, instance=exc) from exc
        samples.append(out.value)
    batch = loader.collate_fn(samples) if loader._auto_collation else loader.collate_fn(samples[0])
    if loader._copier is not None:
        batch, fence = loader._copier.copy(batch)
        loader._copier.hand_over(batch, fence)
    elif loader.pin_memory and torch.accelerator.is_available():
        from torch.utils.data._utils.pin_memory import pin_memory
        batch = pin_memory(batch)
    return batch


def no_batch_message(loader: Any, epoch: Any, pad: Padding) -> str:
    """Why a rank has no batch to repeat, naming the rank, the epoch and the fix."""
    from headrace.runtime.distributed import sampler_rank, world

    ranks = sampler_rank(loader._index_sampler) or world()
    who = f"rank {ranks[0]} of {ranks[1]}" if ranks is not None else "this rank"
    n = epoch.origin.epoch if epoch.origin is not None else epoch.meter.epoch
    skipped = epoch.stats().skipped_samples
    why = (f"on_error='skip' skipped every sample it loaded ({skipped} in this process) and "
           "none was delivered in this epoch, so it has no batch to repeat"
           if not pad.last else
           "its last delivered batch cannot be run again here (ODS fills positions with "
           "samples it chose as they came)")
    return (f"headrace: {who} cannot give the {pad.to} batches every rank takes in epoch {n}: "
            f"{why}. Ending the epoch short would leave the other ranks waiting in their next "
            "collective forever. Fix the step that fails (loader.stats().last.skipped_samples "
            "counts them; the first error is logged), or give this rank samples that load")
