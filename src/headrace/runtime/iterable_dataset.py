"""A loader over an ``IterableDataset``: torch's own iterator runs it, and what headrace adds.

The dataset's ``__iter__`` decides which samples come and in what order, in torch's worker
processes; headrace schedules no sample of it (no lanes, timeouts, skips or resume position).
Around torch's iterator headrace keeps what a loader owes its user as for a map-style dataset:
``loader.close()`` stops it. The iterators are subclasses of torch's two (so code that checks
their type still sees torch's), whose workers ``close()`` shuts down (torch's own
``_shutdown_workers``, as its ``__del__`` does) and whose later ``next()`` raises
``LoaderClosedError`` part-way through an epoch, ``StopIteration`` after its end.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

from headrace.errors import LoaderClosedError


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
            raise LoaderClosedError(
                f"loader.close() stopped this IterableDataset epoch part-way: "
                f"{self._num_yielded} batch(es) were delivered, and whether more would come "
                "is unknown (the dataset's __iter__ decides). This iterator cannot deliver the "
                "rest: a new iter(loader) starts the dataset's __iter__ over, as torch does")
        try:
            return super().__next__()  # type: ignore[misc]
        except StopIteration:
            self._ended = True
            raise

    def close(self) -> None:
        """Stop the workers (none without ``num_workers``); later ``next()``: see the class."""
        self._closed = True
        shutdown = getattr(self, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


class SingleProcessIter(_Closable, _SingleProcessDataLoaderIter):
    """torch's ``num_workers=0`` iterator, closable."""


class MultiProcessingIter(_Closable, _MultiProcessingDataLoaderIter):
    """torch's worker-process iterator, closable (its workers stop at ``close()``)."""


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
