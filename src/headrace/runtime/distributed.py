"""Data-parallel ranks (DDP under ``torchrun``, Lightning, Accelerate): sharding and even epochs.

Sharding is the sampler's job, as in torch: a loader given ``sampler=DistributedSampler(ds)``
loads only its rank's share, and Lightning, Fabric and Accelerate inject such a sampler (or a
batch sampler) themselves. headrace does **not** shard on its own when ``torch.distributed`` is
initialised: a framework that already sharded would be sharded twice, and an evaluation loader
that every rank runs whole is a legitimate pattern. A loader with torch's default sampler
(``SequentialSampler`` / ``RandomSampler``) iterated by one of several ranks is the common
mistake, so it warns once, naming ``DistributedSampler``.

Every rank must take the same number of steps, or the collective of the rank with more batches
waits forever. ``DistributedSampler`` gives every rank the same number of samples (padding or
dropping the tail), so ranks agree on ``len(loader)``; sample-aware batching keeps that count
(``ceil(samples / batch_size)``, or ``floor`` with ``drop_last``). ``on_error="skip"`` can make
one rank's epoch a batch short: :class:`EvenBatches` then repeats that rank's last batch until it
has yielded ``len(loader)`` batches (torch's ``DistributedSampler`` pads with repeated samples
for the same reason), and warns with the count. The padding owed is part of the epoch, so a
state dict keeps it and a resume pays it (``runtime/padding.py``); a rank that delivered no
batch in the epoch raises ``UnevenRanksError`` rather than end short.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data as tud

from headrace.pipeline.source import user_attr
from headrace.runtime import padding, span

_DEFAULT_SAMPLERS = (tud.SequentialSampler, tud.RandomSampler)


def world() -> tuple[int, int] | None:
    """``(rank, world_size)`` when ``torch.distributed`` is initialised with more than one
    rank, else ``None``."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size()
    return (dist.get_rank(), size) if size > 1 else None


def is_sharded(sampler: Any) -> bool:
    """True when ``sampler`` (or the sampler under a batch sampler) hands each rank its own
    share: torch's ``DistributedSampler``, or any sampler that says how many replicas or
    processes it serves (Accelerate's ``BatchSamplerShard``, most custom distributed
    samplers)."""
    for s in nested(sampler):
        if isinstance(s, tud.distributed.DistributedSampler):
            return True
        if any(user_attr(s, a) not in (None, 1) for a in ("num_replicas", "num_processes")):
            return True
    return False


def nested(sampler: Any) -> Iterator[Any]:
    """``sampler`` and the samplers under it (``BatchSampler(DistributedSampler)``, wrappers
    of it), four deep at most."""
    for _ in range(4):
        if sampler is None:
            return
        yield sampler
        inner = user_attr(sampler, "sampler")
        sampler = inner if inner is not None else user_attr(sampler, "batch_sampler")


def sampler_rank(sampler: Any) -> tuple[int, int] | None:
    """``(rank, replicas)`` a sharded ``sampler`` (or the sampler under a batch sampler) was
    given itself (``DistributedSampler(num_replicas=, rank=)`` without a process group;
    Accelerate's ``process_index``/``num_processes``), else ``None``."""
    for s in nested(sampler):
        for rank, size in (("rank", "num_replicas"), ("process_index", "num_processes")):
            r, n = user_attr(s, rank), user_attr(s, size)
            if isinstance(r, int) and isinstance(n, int) and n > 1:
                return r, n
    return None


def unsharded_warning(sampler: Any, ranks: tuple[int, int] | None) -> str | None:
    """The warning for a loader that every one of several ranks would iterate whole, or
    ``None``. Only torch's default samplers count: a custom sampler is the user's decision."""
    if ranks is None or is_sharded(sampler):
        return None
    inner = user_attr(sampler, "sampler") if isinstance(sampler, tud.BatchSampler) else sampler
    if not isinstance(inner, _DEFAULT_SAMPLERS):
        return None
    rank, size = ranks
    return (f"headrace: torch.distributed runs {size} ranks but this loader's sampler is a "
            f"{type(inner).__name__}, so rank {rank} iterates the whole dataset, as torch's "
            "DataLoader would. Pass sampler=torch.utils.data.DistributedSampler(dataset) (and "
            "call its set_epoch(epoch) each epoch) to give each rank its share; Lightning, Fabric "
            "and Accelerate (headrace.integrations.accelerate) do this for you.")


def needs_even_batches(sampler: Any, on_error: str) -> bool:
    """Whether a rank's epoch must be padded to ``len(loader)`` batches: a sharded sampler (so
    other ranks expect the same count) and ``on_error="skip"`` (which can drop a batch)."""
    return on_error == "skip" and is_sharded(sampler)


def start_epoch(loader: Any, it: Any) -> Any:
    """The loader's hook at ``iter()``: warn (once per loader) when several ranks would each
    iterate the whole dataset; pad the epoch when ranks must agree on its batch count."""
    sampler = loader._index_sampler
    if not getattr(loader, "_warned_unsharded", False):
        message = unsharded_warning(sampler, world())
        if message is not None:
            loader._warned_unsharded = True
            warnings.warn(message, stacklevel=3)
    pad = getattr(loader._epoch_ref(), "padding", None)  # (epochs.start_epoch's)
    if pad is not None:  # a resumed epoch: as many as every rank takes, less those before it
        return EvenBatches(it, span.batches_left(loader, it), loader, loader._epoch_ref())
    return it


class EvenBatches:
    """An epoch iterator that yields exactly ``expected`` batches: the wrapped one's, then its
    last batch again as often as it fell short (``repeated`` counts them; the epoch's
    ``padding`` counts them too, for its state dict). Where this process yielded no batch of
    the epoch (a resumed one whose rest was skipped), the last batch the epoch delivered before
    is run again (``padding.rerun``); where it delivered none, ``UnevenRanksError``. Everything
    else (state dict, stats, close) is the wrapped iterator's."""

    def __init__(self, inner: Any, expected: int, loader: Any = None, epoch: Any = None) -> None:
        self._inner = inner
        self._expected = expected
        self._yielded = 0
        self._last: Any = None
        self._loader = loader
        self._epoch = epoch  # the epoch iterator (under a device prefetcher: the one it wraps)
        self.repeated = 0

    def __iter__(self) -> EvenBatches:
        return self

    def __len__(self) -> int:
        return self._expected

    @property
    def batches_owed(self) -> int:
        """Batches the epoch still owes, padding included (``span.at_end``: it is not over
        before they are paid)."""
        return int(self._epoch.batches_owed) if self._epoch is not None else 0

    def __next__(self) -> Any:
        ended = False
        try:
            batch = next(self._inner)
        except StopIteration:
            if self._yielded >= self._expected:
                raise
            ended = True
        if ended:  # (out of the except: an error here is not one "during" the epoch's end)
            if self._epoch is not None:  # loader.close() or load_state_dict() halted it
                self._epoch.raise_if_halted()
            pad = getattr(self._epoch, "padding", None)
            if self._last is None:
                if pad is None:
                    raise StopIteration
                self._last = padding.rerun(self._loader, self._epoch, pad)
            if self.repeated == 0:
                every = pad.to if pad is not None else self._expected  # (a resumed epoch's
                # expected is what is left of it)
                warnings.warn(
                    f"headrace: on_error='skip' left this rank {self._expected - self._yielded} "
                    f"batch(es) short of the {every} every rank takes; its last batch "
                    "is repeated so that no rank waits at the end of the epoch", stacklevel=2)
            self.repeated += 1
            if pad is not None:
                pad.paid += 1
                padding.paid(self._loader, self._epoch)
            batch = self._last
        self._yielded += 1
        self._last = batch
        return batch

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)
