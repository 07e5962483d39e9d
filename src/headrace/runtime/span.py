"""How far an epoch reaches, its span (pure functions over a loader and its running epoch): the
positions it has, the batch settings that cut them, whether every one is settled, and what an
epoch stopped before that says at its next ``next()``. Read by ``state_dict()`` (between epochs
or in one), ``load_state_dict()`` and ``close()`` (``runtime/loader.py``) and by the start of
a resumed epoch (``runtime/epochs.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.utils.data as tud

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


def at_end(loader: DataLoader, it: Any, read_ahead: bool = True) -> bool:
    """:func:`all_settled`, and the sampler read to its end (``num_workers=0`` reads it one
    group at a time: its end is read here, as the ``next()`` that ends the epoch would), so
    the state between epochs gives the next epoch the order it would have had. Where the
    sampler's ``__len__`` may not be what it yields (:func:`length_is_hint`), only reading it
    tells its end: without workers it is read once more here whenever every position it gave
    is settled (``EpochBase.ends_here``; what it gives beyond is kept for the next
    ``next()``), so a state at the last batch of a sampler that gave more than its length (an
    oversampler) or fewer (an undersampler) is the one between epochs, as with a length that
    is right. An undersampler's, not read, was a state inside the epoch, and its resume an
    empty epoch; torch's own samplers, whose length is exact, are never read ahead.
    ``read_ahead=False`` (an epoch being closed: ``break``, ``loader.close()``): not read
    ahead, as torch reads no sampler there (a sampler drawing from the global generators moved
    the loop's draws, one waiting on the loop blocked the close; a review); ``state_dict()``
    reads it later if asked (:func:`settle_unread`)."""
    if batches_owed(it):  # a DDP rank's padding is part of its epoch (runtime/padding.py)
        return False
    if all_settled(loader, it):
        read_end = getattr(it, "read_end", None)
        return read_end is None or bool(read_end())
    return read_ahead and may_read_end(loader, it) and bool(it.ends_here())


def may_read_end(loader: DataLoader, it: Any) -> bool:
    """Whether :func:`at_end` may read ``it``'s sampler ahead to tell its end (a sampler of
    the user's, without workers: :func:`length_is_hint`, ``EpochBase.ends_here``)."""
    return getattr(it, "ends_here", None) is not None and length_is_hint(loader)


def settle_unread(loader: DataLoader) -> None:
    """For ``state_dict()``: an epoch closed before its end was read (``loader._abandoned``
    with ``read_ahead=False``) whose sampler may end next is read now, as ``state_dict()``
    reads a running one's (:func:`at_end`): at its end, the state is the one between epochs."""
    unread, loader._unfinished_unread = loader._unfinished_unread, None
    if unread is not None and unread[1] is loader._unfinished and at_end(loader, unread[0]):
        loader._unfinished = None


def batches_owed(it: Any) -> int:
    """Batches the running epoch ``it`` of a DDP rank whose epochs are padded still owes to
    reach the count every rank takes (``runtime/padding.py``), padding included: its own
    batches all settled, it is not over before they are paid. 0: none, or not padded."""
    return int(getattr(it, "batches_owed", 0) or 0)


_EXACT_LENGTH = (tud.SequentialSampler, tud.RandomSampler, tud.SubsetRandomSampler,
                 tud.WeightedRandomSampler, tud.DistributedSampler)


def length_is_hint(loader: DataLoader) -> bool:
    """Whether the sampler's ``__len__`` (what :func:`total_positions` counts) may differ from
    what it yields: True for a sampler of the user's (a filtering or class-balancing sampler
    reporting ``len(dataset)``), False for torch's own, by exact type (a subclass may yield
    otherwise), whose length is what they yield, and where no length is known (nothing to
    read against: ``runtime/span.py`` never guesses an end)."""
    if total_positions(loader) is None:
        return False
    if not loader._auto_collation:
        sampler: Any = loader._index_sampler
    else:
        user: Any = loader.batch_sampler  # (total_positions: torch's own BatchSampler)
        sampler = user.sampler if loader._user_batch_sampler else loader.sampler
    return type(sampler) not in _EXACT_LENGTH


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
    :func:`at_end` (not read ahead: where the sampler may end next, the next ``next()`` reads
    it, ``EpochBase.halting``), its later ``next()`` calls raise ``LoaderClosedError`` (``why``: what closed it
    and what to do, ``EpochBase.halting``'s defaults otherwise). It went by
    :func:`all_settled` alone: an oversampler closed at its last batch, its end not read yet,
    raised ``LoaderClosedError``; one closed where its deliveries reached its ``__len__``,
    half of it still to come, ended with a ``StopIteration`` (``num_workers=0``). A DDP rank's
    epoch closed with padding still owed (:func:`batches_owed`) is halted too: its padding
    wrapper went on repeating batches after ``close()`` or ``load_state_dict()`` (a review)."""
    if epoch is not None and (not epoch.closed or batches_owed(epoch)) \
            and not at_end(loader, epoch, read_ahead=False):
        epoch.halting(epoch_positions(loader, epoch), length_or_none(loader), *why,
                      sized=total_positions(loader) is not None)


def length_or_none(loader: DataLoader) -> int | None:
    """``len(loader)``, or None where the sampler cannot say (no ``__len__``, or one that
    raises): a state dict of such a loader records its batches per epoch as unknown."""
    try:
        return len(loader)
    except Exception:  # noqa: BLE001 - as torch, which asks only when the user does
        return None
