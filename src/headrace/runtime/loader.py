"""``headrace.DataLoader``: a ``torch.utils.data.DataLoader`` with sample-level scheduling.

It is a subclass of torch's DataLoader (torch 2.13): torch's ``__init__`` validates the
arguments and builds the sampler, batch sampler and collate function, so frameworks that check
the type or rebuild a loader from its attributes (Lightning, Fabric, Accelerate) accept it and
get a headrace loader back. An ``IterableDataset`` is iterated by torch's own code.

The one difference in defaults: ``in_order=None``. Where the sampler's order is random anyway
(``shuffle=True``), batches are filled with whichever samples finish first (sample-aware
batching, MinatoLoader), so one slow sample never holds up a batch; every sample of the epoch is
still delivered exactly once. Where the user asked for an order (``shuffle=False``, any sampler
that is not random) torch's order and batches are kept. ``in_order=True`` / ``False`` force one
or the other (``runtime/ordering.py``).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.utils.data as tud

from headrace.cache.session import CacheSession, open_session
from headrace.errors import HeadraceError
from headrace.pipeline import Pipeline
from headrace.planner.executor import forced_processes
from headrace.planner.explain import explain_text
from headrace.remote.facts import started_and_placed
from headrace.remote.session import remote_session
from headrace.runtime import (
    checkpoint,
    distributed,
    epochs,
    explaining,
    iterable_dataset,
    loader_state,
    padding,
    prefetch,
    worker_count,
)
from headrace.runtime import span as epoch_span
from headrace.runtime.bufferpool import BufferPool
from headrace.runtime.collate_rng import CollatePlace
from headrace.runtime.executor_auto import threads_blocked
from headrace.runtime.loader_arguments import check_arguments, loader_generator
from headrace.runtime.monitor import Monitor
from headrace.runtime.options import AutoWorkers, Options
from headrace.runtime.planning import Planning
from headrace.runtime.pool import WorkerPool
from headrace.telemetry.stats import EpochStats, LoaderStats

_T_co = TypeVar("_T_co", covariant=True)

_RUNTIME_ATTRS = ("pipeline", "monitor", "planning", "_pool", "_buffers", "_iterator_ref",
                  "_epoch_ref", "_finalizer", "_device", "_copier", "cache", "remote",
                  "_executor", "_collate_place", "_torch_iter_ref")
"""What a loader holds while it runs; left out of pickles and copies, rebuilt on load."""


class DataLoader(tud.DataLoader[_T_co]):
    """Drop-in replacement for ``torch.utils.data.DataLoader`` (and a subclass of it).

    ``dataset`` may be a :class:`headrace.Pipeline`, any map-style torch ``Dataset`` (a
    ``transform`` with a ``transforms`` list is profiled step by step where the dataset calls
    it), or an ``IterableDataset`` (iterated exactly as torch does). ``num_workers`` is
    respected as given; ``"auto"`` starts from the available cores and adapts (MinatoLoader
    Formulas 1-2; ``loader.num_workers`` is then an :class:`~headrace.runtime.options.AutoWorkers`,
    an ``int`` that remembers it). ``in_order``: see the module docstring. ``options`` holds
    headrace's own settings (:class:`headrace.Options`).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool | None = None,
        options: Options | None = None,
    ) -> None:
        if options is None:
            options = Options()
        elif not isinstance(options, Options):  # a dict, the class itself: failed later
            raise TypeError(f"options= takes a headrace.Options(...) instance (or None: the "
                            f"defaults), got {options!r}")
        iterable = isinstance(dataset, tud.IterableDataset)
        workers = worker_count.normalised(num_workers, options, iterable)
        generator = loader_generator(options, generator)  # warns when seed is not used
        super().__init__(
            dataset, batch_size, shuffle, sampler, batch_sampler, workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order is not False,
        )
        # torch's own iterators read in_order (an IterableDataset's): a bool there; for
        # map-style datasets the user's value, None included, so a rebuilt loader keeps it.
        self.in_order = (in_order is not False) if iterable else in_order  # type: ignore[assignment]
        check_arguments(options, iterable, workers, worker_init_fn, prefetch_factor)
        self.options = options
        self._user_batch_sampler = batch_sampler is not None
        self._epoch = 0
        self._base_seed: int | None = None
        self._resume: checkpoint.ResumePoint | None = None  # loaded, for the next iter()
        self._unfinished: checkpoint.ResumePoint | None = None  # the last epoch, if abandoned
        self._setup_runtime()

    def __setattr__(self, name: str, value: Any) -> None:
        """``num_workers`` set after construction (torch honours it) is normalised as in
        ``__init__`` (``runtime/worker_count.py``); other attributes go to torch's
        ``__setattr__`` (only this name test is added to an assignment)."""
        if name == "num_workers" and "options" in self.__dict__:  # (after __init__'s own)
            value = worker_count.assigned(self, value)
        super().__setattr__(name, value)

    def _setup_runtime(self) -> None:
        """Build what the loader holds while it runs (``_RUNTIME_ATTRS``): at construction and
        after unpickling or copying."""
        self.pipeline: Pipeline | None = None
        if not self._iterable:
            ds = self.dataset
            self.pipeline = (ds if isinstance(ds, Pipeline)
                             else Pipeline.from_dataset(ds, batched=self._auto_collation))
        self.monitor = Monitor(self.options, self.autoscale,
                               self.pipeline.step_names if self.pipeline is not None else None,
                               embedded=self.pipeline is not None and self.pipeline.embedded)
        self._executor: str = ("processes" if self.options.executor == "auto"
                               else self.options.executor)
        """What runs the workers now (``executor="auto"`` starts on processes)."""
        self.monitor.use_executor(self._executor)
        if self.options.executor == "auto":
            blocked = threads_blocked(self)
            if blocked is not None:
                self.monitor.executor_decision = forced_processes(blocked)
            else:
                self.monitor.probe_gil = True
        self.planning = (Planning(self.pipeline, self.options, self.monitor)
                         if self.pipeline is not None else None)  # (an empty one is falsy)
        if self.planning is not None:
            self.monitor.epoch_listeners.append(self.planning.after_epoch)
        self._pool: WorkerPool | None = None
        self._buffers = BufferPool()  # batch memory the training loop let go of, for reuse
        self._collate_place: CollatePlace | None = None  # where a user collate_fn runs
        self._device = prefetch.resolve_device(self.options.device)
        if self._device is not None and self._iterable:
            raise ValueError("Options(device=) needs a map-style dataset; an IterableDataset "
                             "is iterated by torch's own loader: use pin_memory=True instead")
        self._copier = prefetch.copier_for(self._device)  # None: no device prefetch
        self._iterator_ref: Callable[[], Any] = _no_iterator  # the newest iter(), wrappers and all
        self._epoch_ref: Callable[[], Any] = _no_iterator  # the epoch under those wrappers
        self._torch_iter_ref: Callable[[], Any] = _no_iterator  # an IterableDataset's newest
        self._finalizer = weakref.finalize(self, epochs.close_pool, [None])
        self.cache: CacheSession | None = None  # the sample cache (headrace.cache)
        self._cache_off: str | None = None  # why Options(cache=...) is not in use (explain())
        self._cache_dropped: CacheSession | None = None  # one that failed mid-run (its stats)
        if self.pipeline is not None and self.options.cache is not None:
            ctx = self.multiprocessing_context or torch.multiprocessing.get_context()
            self.cache, self._cache_off = open_session(self.options.cache, ctx,
                                                       epochs.local_slots(self),
                                                       self.pipeline)
            if self.cache is not None:
                self.monitor.epoch_listeners.append(self.cache.epoch_listener(self.monitor))
        self.remote = remote_session(self.options.remote, self.monitor)
        """Remote workers (``headrace.remote``), or None without ``Options(remote=...)``."""

    @property
    def _iterator(self) -> Any:
        """torch's persistent iterator (an ``IterableDataset`` with ``persistent_workers``)."""
        return self.__dict__.get("_torch_iterator")

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        """Frameworks end a stage by resetting it to ``None`` after stopping its workers
        (Lightning's ``_shutdown_workers_and_reset_iterator``): the persistent workers headrace
        keeps in ``_pool`` stop then too, unless an epoch still runs on them; the next epoch
        starts new ones."""
        self.__dict__["_torch_iterator"] = value
        pool = self.__dict__.get("_pool")
        if value is None and pool is not None:
            running = self._epoch_ref()
            if running is None or running.finished:
                pool.shutdown()
                self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickling and ``copy.deepcopy`` (``ddp_spawn``, frameworks): the loader's arguments
        and progress (epoch, a pending resume), not its workers, monitor or running epoch."""
        state = {k: v for k, v in self.__dict__.items() if k not in _RUNTIME_ATTRS}
        state.pop("_torch_iterator", None)  # torch's persistent iterator (IterableDataset)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup_runtime()

    @property
    def autoscale(self) -> bool:
        """``num_workers="auto"``: the worker count adapts while it runs."""
        return isinstance(self.num_workers, AutoWorkers)

    @property
    def _is_accelerate_prepared(self) -> bool:
        """Read only by Accelerate's ``prepare()``, which would swap headrace for a plain torch
        loader: it raises, naming ``headrace.integrations.accelerate``."""
        from headrace.integrations import ACCELERATE_PREPARE

        raise HeadraceError(ACCELERATE_PREPARE)

    @property
    def _iterable(self) -> bool:
        return isinstance(self.dataset, tud.IterableDataset)

    # -- torch API -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        """A new epoch. As in torch, iterators are independent (each has its own workers),
        except with ``persistent_workers=True``, where the newest one takes the workers over and
        an older one raises if advanced."""
        if self._iterable:  # torch's iterator, closable (runtime/iterable_dataset.py)
            torch_it = super().__iter__()
            self._epoch += 1  # (iter() calls: the state_dict's epochs_started)
            self._torch_iter_ref = weakref.ref(torch_it)
            return torch_it
        loader_state.load_unloaded(self)  # a Lightning checkpoint's state Lightning skips
        epochs.warn_inert_timeouts(self)
        old = self._iterator_ref()
        if old is not None and self.persistent_workers:
            old.close(replaced=True)
        it = epochs.start_epoch(self)
        it.loader = self  # the epoch keeps its loader (and a persistent pool) alive, not the reverse
        self._epoch_ref = weakref.ref(it)
        if self._copier is not None:
            it = prefetch.DevicePrefetcher(it, self._copier, self._buffers.fence)
        it = distributed.start_epoch(self, it)  # DDP ranks: a warning, an even batch count
        self._iterator_ref = weakref.ref(it)  # weak: `break` must let the epoch be collected
        return it

    # -- headrace API --------------------------------------------------------------------------
    def stats(self) -> LoaderStats:
        """Per-epoch wall, stall, throughput, lanes, timeout, workers, queues (see LoaderStats)."""
        it = self._iterator_ref()
        epochs: tuple[EpochStats, ...] = tuple(self.monitor.epochs)
        kept = self.cache if self.cache is not None else self._cache_dropped
        if kept is not None:
            epochs = kept.attach(epochs)
        if it is not None and not it.closed:
            running = it.stats()
            epochs += (dataclasses.replace(running, cache=self.cache.current())
                       if self.cache is not None else running,)
        pol = self.monitor.timeout
        pool = self._pool if self._pool is not None else getattr(it, "pool", None)
        workers = pool.size if pool is not None else 0
        if pool is not None and self.remote is not None:  # a remote one counts once placed
            started, placed = started_and_placed(self.remote, pool)
            workers -= started - placed
        if self._iterable:  # torch's iterator's processes: headrace has no pool of its own
            workers = iterable_dataset.live_workers(self, self._torch_iter_ref())
        return LoaderStats(
            epochs=epochs,
            timeout_s=pol.timeout_s,
            timeout_percentile=pol.percentile_in_force,
            timeout_fallback_from=pol.config.percentile if pol.using_fallback else None,
            workers=workers,
            workers_timeline=tuple(self.monitor.workers_timeline),
            timeout_timeline=tuple(self.monitor.timeout_timeline),
            queues=tuple(self.monitor.queues),
            worker_restarts=self.monitor.worker_restarts,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: enough to resume exactly, in another process, mid-epoch or not.

        Small (RNG state plus one bit per sample, compressed), JSON and ``torch.save``
        friendly, versioned (``schema_version``). With ``generator=`` or ``Options(seed=)`` the
        following epochs are identical too; with torch's global generator they are as long as
        the training script restores that generator as it does for its model. Over an
        ``IterableDataset``: no position, only the ``iter()`` calls so far, the batches the
        running epoch delivered, and what decides the next epoch's worker seeds (the loader's
        generator, a base seed to reuse: ``runtime/iterable_dataset.py``).
        """
        return loader_state.save(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` delivers exactly what was left,
        with the step order the saved epoch ran (saved between epochs: the next one's).

        Refused (``StateDictError``) only when a resume would deliver other samples: another
        dataset length or batch layout, an unknown schema, a state saved over an
        ``IterableDataset``. Changed step or dataset code (an edited script) is reported in a
        warning, and the resume goes on. Over an ``IterableDataset`` there is no position to
        restore: a state saved part-way warns (``IterablePositionWarning``) that the next
        ``iter()`` starts that epoch over, as with torch's DataLoader.
        """
        loader_state.load(self, state)

    def _get_iterator(self) -> Any:
        """torch's iterator for an ``IterableDataset``, as its closable subclass."""
        if self._iterable:
            return iterable_dataset.new_iterator(self)
        return super()._get_iterator()

    def _abandoned(self, it: Any) -> None:
        """An epoch closed before its end (``break``, an exception, a newer iterator): until
        the next epoch starts, ``state_dict()`` describes where it stopped, as it would have
        while it was open, so a checkpoint written after leaving the loop resumes it."""
        latest = self._epoch_ref()
        if it.origin is not None and (latest is None or latest is it) \
                and not epoch_span.at_end(self, it):  # left after its last batch: it is done
            self._unfinished = checkpoint.ResumePoint(
                epoch=it.origin.epoch, in_epoch=True, origin=it.origin, delivered=it.delivered,
                generator_state=None, persistent_base_seed=None, steps=it.steps,
                empty_batches=it.empty_batches, batches=it.batches_delivered or 0,
                positions_read=epoch_span.positions_read(it), last_batch=padding.last_keys(it))

    def _ended_after_close(self, it: Any) -> None:
        """``it``, closed part-way, was found at its end by the ``next()`` after the close
        (``EpochBase.halting``): ``state_dict()`` no longer describes it as unfinished."""
        if self._unfinished is not None and self._unfinished.origin is it.origin:
            self._unfinished = None

    def explain(self) -> str:
        """Every decision headrace made for this loader and the measured numbers behind it."""
        if self.pipeline is None or self.planning is None:
            return "headrace: an IterableDataset is iterated exactly as torch does; nothing to plan"
        return explain_text(explaining.facts(self))

    def add_sample_listener(self, fn: Callable[[int, float, bool], None]) -> None:
        """Call ``fn(index, seconds, slow)`` in the training process for every finished sample.

        ``seconds`` is the sample's total step time (load included) measured in the worker(s);
        ``slow`` tells whether it went through the slow lane. Used by benchmarks and tools.
        """
        def listener(index: int, step_s: float | None, slow: bool, _timings: Any) -> None:
            if step_s is not None:  # None: a segment handed to the slow lane, not yet finished
                fn(index, step_s, slow)

        self.monitor.sample_listeners.append(listener)

    def close(self) -> None:
        """Stop the running epoch and every worker (also done on ``del`` and at exit). An
        epoch stopped before its end raises ``LoaderClosedError`` at its next ``next()``."""
        if self._iterable:
            iterable_dataset.close(self, self._torch_iter_ref())
        it = self._iterator_ref()
        epoch_span.halt_unfinished(self, self._epoch_ref())
        if it is not None:
            it.close()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.cache is not None:
            self.cache.close()
        if self.planning is not None:
            self.planning.after_epoch(now=True)  # what the last epochs measured, if not saved


def _no_iterator() -> None:
    return None

