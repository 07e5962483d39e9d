"""A loader over an ``IterableDataset``: torch's own iterator runs it, and what headrace adds.

The dataset's ``__iter__`` decides which samples come and in what order, in torch's worker
processes; headrace schedules no sample of it (no lanes, timeouts, skips or resume position).
Around torch's iterator headrace keeps what a loader owes its user as for a map-style dataset:

* ``loader.close()`` stops it: the iterators are subclasses of torch's two (so code that checks
  their type still sees torch's), whose workers ``close()`` shuts down (torch's own
  ``_shutdown_workers``, as its ``__del__`` does) and whose later ``next()`` raises
  ``LoaderClosedError`` part-way through an epoch, ``StopIteration`` after its end.
* ``state_dict()`` records no position (torch's iterator has none to give): the iter() calls so
  far and how far the running epoch got. ``load_state_dict()`` of it warns
  (``IterablePositionWarning``) when that epoch was part-way: the next ``iter()`` starts it over,
  as a resumed run does with torch's DataLoader, which frameworks (Lightning) do not checkpoint.
* What decides the workers' seeds is saved, so a resumed run's epochs get the seeds the
  uninterrupted run's would (``get_worker_info().seed``: torch's base seed, drawn from the
  loader's generator at each new iterator, plus the worker id). The state holds the loader's
  generator (``generator=`` or ``Options(seed=)``; without one torch draws from its global
  generator, which the training script restores as it does for its model) and, where the next
  ``iter()`` must not draw a new base seed, the one it reuses: a part-way epoch's (started over
  with its own seeds) and persistent workers' (torch draws theirs once). Before, the state held
  neither: a run resumed between epochs replayed epoch 0's seeds, silently.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.utils.data._utils import MP_STATUS_CHECK_INTERVAL
from torch.utils.data.dataloader import (
    _BaseDataLoaderIter,
    _MultiProcessingDataLoaderIter,
    _SingleProcessDataLoaderIter,
)

from headrace.errors import IterablePositionWarning, LoaderClosedError, StateDictError
from headrace.runtime import state_checks
from headrace.runtime.checkpoint import capture_rng, rng_from_str, rng_to_str
from headrace.runtime.options import AutoWorkers
from headrace.user_frame import warn

KIND = "iterable"
"""``state["dataset_kind"]`` of an IterableDataset loader's state (a map-style one has none)."""
SCHEMA_VERSION = 2
"""``state["schema_version"]`` of that state: its own numbering, not the map-style one's. 2 added
``generator_state`` and ``base_seed``; a version 1 state (neither) still loads, as before."""
_READS = (1, SCHEMA_VERSION)
_BASE_SEED = "_iterable_base_seed"
"""The loader attribute holding a loaded ``base_seed`` until the next new iterator takes it."""


class _SeededStart(_BaseDataLoaderIter):
    """torch's iterator start, where a loaded state named the base seed: that seed, and the
    generator it is drawn from left as it was (the uninterrupted run drew it before the save).
    Placed in the MRO between torch's iterator class and its base, so the seed is set before
    torch's ``__init__`` starts worker processes with it."""

    def __init__(self, loader: Any) -> None:
        seed = loader.__dict__.pop(_BASE_SEED, None)
        if seed is None:
            super().__init__(loader)
            return
        before = capture_rng(loader.generator)  # the loader's, else torch's global one
        super().__init__(loader)
        if loader.generator is not None:
            loader.generator.set_state(before)
        else:
            torch.set_rng_state(before)
        self._base_seed = seed


class _Closable:
    """What headrace adds to torch's iterator: ``close()`` and what ``next()`` raises after it."""

    _closed = False  # (class defaults: torch's __init__ calls _reset before ours could run)
    _ended = False  # the running epoch raised StopIteration: it delivered all it had
    _num_yielded: int  # torch's: batches the running epoch delivered

    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)  # type: ignore[misc]
        self._ended = False  # a persistent iterator's next epoch

    def __next__(self) -> Any:
        if self._closed:
            if self._ended:
                raise StopIteration
            raise self._closed_error()
        try:
            return super().__next__()  # type: ignore[misc]
        except StopIteration:
            if self._closed:  # close() from another thread marked every worker done while
                # this one waited, and torch's iterator read that as the epoch's end (a full
                # test run, 1 in about 10): the end was not reached
                raise self._closed_error() from None
            self._ended = True
            raise
        except (OSError, EOFError) as e:  # its queues went away under it: close() from
            if self._closed:  # another thread while this one waited for a batch
                raise self._closed_error() from e
            raise

    def _closed_error(self) -> LoaderClosedError:
        return LoaderClosedError(
            f"loader.close() stopped this IterableDataset epoch part-way: "
            f"{self._num_yielded} batch(es) were delivered, and whether more would come "
            "is unknown (the dataset's __iter__ decides). This iterator cannot deliver the "
            "rest: a new iter(loader) starts the dataset's __iter__ over, as torch does")

    @property
    def part_way(self) -> bool:
        """Some of the running epoch was delivered and its end was not reached."""
        return not self._ended and self._num_yielded > 0

    def close(self) -> None:
        """Stop the workers (none without ``num_workers``); later ``next()``: see the class."""
        self._closed = True
        shutdown = getattr(self, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


class SingleProcessIter(_Closable, _SingleProcessDataLoaderIter, _SeededStart):
    """torch's ``num_workers=0`` iterator, closable."""


class MultiProcessingIter(_Closable, _MultiProcessingDataLoaderIter, _SeededStart):
    """torch's worker-process iterator, closable (its workers stop at ``close()``)."""

    def _try_get_data(self, timeout: float = MP_STATUS_CHECK_INTERVAL) -> Any:
        # torch's wait for a batch polls its queue and, at each timeout, whether a worker it
        # still counts died: closed from another thread while the training thread waited,
        # no worker counts any more and it waited for ever (a review's repro, 1 run in 4)
        if self._closed:
            raise self._closed_error()
        return super()._try_get_data(timeout)


def new_iterator(loader: Any) -> _Closable:
    """What torch's ``DataLoader._get_iterator`` returns, as its closable subclass."""
    if loader.num_workers == 0:
        return SingleProcessIter(loader)
    loader.check_worker_number_rationality()
    return MultiProcessingIter(loader)


def close(loader: Any, running: _Closable | None) -> None:
    """``loader.close()``: stop the newest iterator and torch's persistent one; the next
    ``iter(loader)`` starts new workers."""
    persistent = loader.__dict__.get("_torch_iterator")
    for it in (running, persistent):
        if it is not None:
            it.close()
    loader.__dict__["_torch_iterator"] = None


def live_workers(loader: Any, running: _Closable | None) -> int:
    """``stats().workers``: the worker processes torch's running (or persistent) iterator has
    and has not shut down; 0 without workers or once closed."""
    for it in (running, loader.__dict__.get("_torch_iterator")):
        if isinstance(it, MultiProcessingIter) and not it._shutdown:
            return int(it._num_workers)
    return 0


def fixed_workers(auto: AutoWorkers) -> int:
    """``num_workers="auto"``: torch's iterator runs a fixed number of workers, so ``auto``
    means the count it would start with (``AutoscaleConfig.initial``, else the available
    cores); a warning names it."""
    warnings.warn(
        f"num_workers='auto' over an IterableDataset: torch's iterator runs a fixed number of "
        f"worker processes (the dataset's __iter__ in each), which headrace cannot scale; "
        f"using num_workers={int(auto)}, the count 'auto' starts with (AutoscaleConfig.initial, "
        f"else the available cores)", UserWarning, stacklevel=3)
    return int(auto)


def state(loader: Any, running: _Closable | None) -> dict[str, Any]:
    """``state_dict()``: ``epochs_started`` (``iter(loader)`` calls so far) and
    ``batches_delivered`` (of the running epoch while it is part-way, else 0); no position.
    ``generator_state``: the loader's generator now (None without one); ``base_seed``: the
    base seed the next ``iter()`` reuses instead of drawing one (None: it draws), see
    :func:`_next_base_seed`; ``persistent_workers``: the loader's, which decides the later
    epochs' base seeds (a resume with the other setting warns, as a map-style one does)."""
    batches = 0  # (no truth test of the iterator: it has torch's __len__, which may raise)
    if running is not None and running.part_way:  # closed part-way too: still unfinished
        batches = running._num_yielded
    gen = loader.generator
    return {"dataset_kind": KIND, "schema_version": SCHEMA_VERSION,
            "epochs_started": loader._epoch, "batches_delivered": batches,
            "generator_state": rng_to_str(gen.get_state()) if gen is not None else None,
            "base_seed": _next_base_seed(loader, running),
            "persistent_workers": bool(loader.persistent_workers)}  # (state_checks: seeding)


def _next_base_seed(loader: Any, running: _Closable | None) -> int | None:
    """The base seed an uninterrupted run's next epoch has without drawing one: a loaded one
    no iterator took yet, persistent workers' (torch draws it once, at their start), or the
    running epoch's while it is part-way (a resume starts it over: with the seeds it had)."""
    loaded = loader.__dict__.get(_BASE_SEED)
    if loaded is not None:
        return int(loaded)
    persistent = loader.__dict__.get("_torch_iterator")
    if persistent is not None:
        return int(persistent._base_seed)
    if running is not None and running.part_way:
        return int(running._base_seed)  # type: ignore[attr-defined]
    return None


def load(loader: Any, sd: Any) -> None:
    """``load_state_dict()``: keep the epoch count, the generator's state and the base seed
    the next ``iter()`` reuses (persistent workers started before stop: theirs is another);
    warn when the saved epoch was part-way (its batches come again) and when it was saved
    with another ``persistent_workers``; refuse a map-style loader's state."""
    if not isinstance(sd, dict) or sd.get("dataset_kind") != KIND:
        raise StateDictError(
            "this state dict is not an IterableDataset loader's (no dataset_kind='iterable': "
            "a map-style dataset's loader saved it?); this loader iterates an IterableDataset, "
            "whose position torch's iterator cannot restore")
    if sd.get("schema_version") not in _READS:
        raise StateDictError(f"IterableDataset state dict schema_version "
                             f"{sd.get('schema_version')} is not supported by this headrace "
                             f"(it reads {', '.join(map(str, _READS))})")
    loader._epoch = int(sd["epochs_started"])
    gen = sd.get("generator_state")
    if gen is not None and loader.generator is not None:
        loader.generator.set_state(rng_from_str(gen))
    seed = sd.get("base_seed")
    loader.__dict__[_BASE_SEED] = int(seed) if seed is not None else None
    state_checks.warn_seeding_changes(
        sd, loader.persistent_workers,
        "The next epoch's workers get the saved base seed; the epochs after it"
        if seed is not None else "The next epochs")
    if loader.__dict__.get("_torch_iterator") is not None:  # its workers have their own seed
        close(loader, None)
    batches = int(sd["batches_delivered"])
    if batches:
        warn(
            f"load_state_dict(): the saved IterableDataset epoch had delivered {batches} "
            "batch(es); an IterableDataset's position cannot be restored (torch's iterator "
            "runs the dataset's own __iter__), so the next iter(loader) starts that epoch over "
            "and delivers them again, as with torch's DataLoader (its workers get the seeds "
            "they had: get_worker_info().seed)", IterablePositionWarning)


def refuse_iterable_state(sd: Any) -> None:
    """A map-style loader's ``load_state_dict``: a state saved over an IterableDataset."""
    if isinstance(sd, dict) and sd.get("dataset_kind") == KIND:
        raise StateDictError(
            "this state dict was saved by a loader over an IterableDataset (it records no "
            "position); this loader's dataset is map-style: save its own state_dict()")
