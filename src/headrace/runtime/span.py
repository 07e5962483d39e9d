"""How far an epoch reaches, its span (pure functions over a loader and its running epoch): the
positions it has, the batch settings that cut them, whether every one is settled, and what an
epoch stopped before that says at its next ``next()``. Read by ``state_dict()`` (between epochs
or in one), ``load_state_dict()`` and ``close()`` (``runtime/loader.py``) and by the start of
a resumed epoch (``runtime/epochs.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader


def batching(loader: DataLoader) -> tuple[int | None, bool]:
    """The ``batch_size`` and ``drop_last`` an epoch's sampler batches are cut with: a user's
    torch ``BatchSampler``'s own, else the loader's; ``(None, False)`` with ``batch_size=None``
    or a batch sampler of another kind (its batches are its own)."""
    if not loader._auto_collation:
        return None, False
    if loader._user_batch_sampler:
        user: Any = loader.batch_sampler
        if type(user) is not torch.utils.data.BatchSampler:
            return None, False
        return user.batch_size, bool(user.drop_last)
    return loader.batch_size, bool(loader.drop_last)


def total_positions(loader: DataLoader) -> int | None:
    """Samples in an epoch when the sampler knows its length, else ``None`` (also where its
    ``__len__`` raises something else than ``TypeError``: torch asks it only in ``len(loader)``,
    so a sampler may say ``NotImplementedError`` there)."""
    try:
        if not loader._auto_collation:
            return len(loader._index_sampler)
        bs, drop_last = batching(loader)
        if bs is None:  # a batch sampler of another kind: how many it gives is its own
            return None
        user: Any = loader.batch_sampler  # (a user's: torch's own BatchSampler, as checked)
        sampler: Any = user.sampler if loader._user_batch_sampler else loader.sampler
        n = len(sampler)
        return n - n % bs if drop_last else n
    except Exception:  # noqa: BLE001 - a length the sampler cannot give is an unknown one
        return None


def epoch_positions(loader: DataLoader, it: Any) -> int | None:
    """Positions in the running epoch ``it``: those its sampler gave once it was read to its
    end (``EpochBase.known_length``: the workers' feed reads it ahead of the deliveries;
    ``num_workers=0`` reads it a batch at a time, as torch, so its end is unknown until a
    ``next()`` reads it), else :func:`total_positions` while the sampler has given no more
    than that; ``None``: unknown. A sampler's ``__len__`` is a hint: torch asks it only in
    ``len(loader)``, and a sampler may yield more (an oversampler saying ``len(dataset)``),
    whose epoch then goes on past it (a bug hunt: it was taken as whole there, and a resume
    lost its rest)."""
    known = it.known_length()
    if known is not None:
        return int(known)
    return hinted(total_positions(loader), positions_read(it))


def positions_read(it: Any) -> int | None:
    """Positions the running epoch ``it`` read from its sampler so far, before its resume
    included (its order digest counts them: ``runtime/order_digest.py``); None: unknown."""
    order = getattr(it.origin, "order", None) if it.origin is not None else None
    return None if order is None else int(order.read)


def hinted(total: int | None, read: int | None) -> int | None:
    """The epoch's length a sampler's ``__len__`` says (``total``), unless it has given more
    positions than that (``read``): then unknown (None) until its end is seen."""
    return None if total is None or (read is not None and read > total) else total


def all_settled(loader: DataLoader, it: Any) -> bool:
    """Whether every position of the running epoch ``it`` is delivered or settled without
    (skipped, failed, dropped): its last batch is out and only its end is not seen yet, as
    where Lightning, which knows ``len(loader)``, writes a checkpoint at an epoch's last step.
    Its draws are all made (at ``iter()``), so the state between epochs describes it. Never
    where the epoch's length is unknown (a sampler without one, not read to its end; one that
    gave more positions than its ``__len__`` said, not read to its end)."""
    return _whole(epoch_positions(loader, it), it.delivered.count + it.settled_undelivered())


def at_end(loader: DataLoader, it: Any) -> bool:
    """:func:`all_settled`, and the sampler read to its end (``num_workers=0`` reads it one
    group at a time: its end is read here, as the ``next()`` that ends the epoch would), so
    the state between epochs gives the next epoch the order it would have had. A sampler that
    gave more than its ``__len__`` said is read here too once every position it gave is
    settled: its end may be next, and a state at its last batch is then the one between
    epochs, as with a length that is right (not read, it resumed an empty epoch there). A
    sampler yielding fewer positions than its ``__len__`` (an undersampler) is not read ahead
    before its deliveries reach that length: reading it at every ``state_dict()`` changed what
    a sampler drawing from the global generators as it goes gave, and the loop's own draws (a
    review); its state at its last batch without workers is inside the epoch, whose resumed
    rest is empty (docs/reliability.md), and a ``close()`` there leaves the read to the next
    ``next()`` (``EpochBase.halting``)."""
    if batches_owed(it):  # a DDP rank's padding is part of its epoch (runtime/padding.py)
        return False
    read_end = getattr(it, "read_end", None)
    if not all_settled(loader, it) and not (read_end is not None and _past_length(loader, it)):
        return False
    return read_end is None or bool(read_end())


def batches_owed(it: Any) -> int:
    """Batches the running epoch ``it`` of a DDP rank whose epochs are padded still owes to
    reach the count every rank takes (``runtime/padding.py``), padding included: its own
    batches all settled, it is not over before they are paid. 0: none, or not padded."""
    return int(getattr(it, "batches_owed", 0) or 0)


def _past_length(loader: DataLoader, it: Any) -> bool:
    """Whether the running epoch ``it`` read more positions than its sampler's ``__len__``
    says, and every one is settled."""
    total, read = total_positions(loader), positions_read(it)
    return (total is not None and read is not None and total < read
            <= it.delivered.count + it.settled_undelivered())


def covers(loader: DataLoader, settled: int, read: int | None, owed: int = 0) -> bool:
    """Whether a saved epoch's ``settled`` positions are the whole epoch: its length known, its
    sampler, when saved, had read no more positions than that (``read``: None in state dicts
    saved before they recorded it), and no padding batch owed (``owed``: a DDP rank's,
    ``padding.owed_at_resume``)."""
    return not owed and _whole(hinted(total_positions(loader), read), settled)


def _whole(total: int | None, settled: int) -> bool:
    """Whether ``settled`` positions are all of an epoch of ``total`` (None: unknown)."""
    return total is not None and 0 < total <= settled


def batches_left(loader: DataLoader, epoch: Any) -> int:
    """Batches a starting ``epoch`` yields when no sample is skipped: ``len(loader)`` less
    those its state dict counted before the resume, else (not counted in this loader's batch
    settings) the positions left, cut as this loader cuts them. Raises ``TypeError`` where the
    loader has no length."""
    n = len(loader)
    before = epoch.batches_delivered  # at the epoch's start: those before its resume
    if before is not None:
        return int(n - before)
    total, (bs, drop_last) = total_positions(loader), batching(loader)
    if total is None or bs is None:
        return n
    left = max(0, total - epoch.delivered.count)
    return left // bs if drop_last else -(-left // bs)


def halt_unfinished(loader: DataLoader, epoch: Any, *why: str) -> None:
    """Before ``close()`` or ``load_state_dict()`` closes the running ``epoch``: unless it is
    :func:`at_end` (where an undersampler may end next, the next ``next()`` reads it:
    ``EpochBase.halting``), its later ``next()`` calls raise ``LoaderClosedError`` (``why``:
    what closed it and what to do, ``EpochBase.halting``'s defaults otherwise). It went by
    :func:`all_settled` alone: an oversampler closed at its last batch, its end not read yet,
    raised ``LoaderClosedError``; one closed where its deliveries reached its ``__len__``,
    half of it still to come, ended with a ``StopIteration`` (``num_workers=0``). A DDP rank's
    epoch closed with padding still owed (:func:`batches_owed`) is halted too: its padding
    wrapper went on repeating batches after ``close()`` or ``load_state_dict()`` (a review)."""
    if epoch is not None and (not epoch.closed or batches_owed(epoch)) \
            and not at_end(loader, epoch):
        epoch.halting(epoch_positions(loader, epoch), length_or_none(loader), *why,
                      sized=total_positions(loader) is not None)


def length_or_none(loader: DataLoader) -> int | None:
    """``len(loader)``, or None where the sampler cannot say (no ``__len__``, or one that
    raises): a state dict of such a loader records its batches per epoch as unknown."""
    try:
        return len(loader)
    except Exception:  # noqa: BLE001 - as torch, which asks only when the user does
        return None
