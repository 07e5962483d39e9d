"""``headrace.DataLoader``: torch's DataLoader keywords, sample-level scheduling underneath.

Every keyword of ``torch.utils.data.DataLoader`` (torch 2.13) is accepted with the same meaning.
To get torch's validation and sampler construction exactly, the facade builds a real (idle)
torch DataLoader from the same arguments and takes its resolved sampler, batch sampler and
collate function; torch's loader never starts a worker here except for an ``IterableDataset``,
which headrace iterates exactly as torch does.

The one difference in defaults: ``in_order=False``. Batches are filled with whichever samples
finish first (sample-aware batching, MinatoLoader), so one slow sample never holds up a batch.
Every sample of the epoch is still delivered exactly once; ``in_order=True`` gives torch's
order and batches exactly.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.data as tud
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from headrace.errors import StateDictError
from headrace.pipeline import Pipeline
from headrace.planner.explain import Facts, explain_text
from headrace.profiler import sizes
from headrace.remote.session import remote_session
from headrace.runtime import checkpoint
from headrace.runtime.batcher import Batcher, Mode
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.bufferpool import BufferPool
from headrace.runtime.checkpoint import EpochOrigin, capture_rng
from headrace.runtime.epoch import EpochIterator
from headrace.runtime.inprocess import InProcessIterator
from headrace.runtime.monitor import Monitor
from headrace.runtime.options import Options
from headrace.runtime.planning import Planning
from headrace.runtime.pool import WorkerPool
from headrace.runtime.work import EpochSpec, default_max_in_flight
from headrace.telemetry.stats import EpochStats, LoaderStats


class DataLoader:
    """Drop-in replacement for ``torch.utils.data.DataLoader``.

    ``dataset`` may be a :class:`headrace.Pipeline`, any map-style torch ``Dataset`` (a
    ``transform`` with a ``transforms`` list is split into steps), or an ``IterableDataset``
    (iterated exactly as torch does). ``num_workers`` is respected as given; ``"auto"`` starts
    from the available cores and adapts (MinatoLoader Formulas 1-2). ``options`` holds headrace's
    own settings (:class:`headrace.Options`).
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
        in_order: bool = False,
        options: Options | None = None,
    ) -> None:
        self.options = options or Options()
        self.autoscale = num_workers == "auto"
        if isinstance(num_workers, str) and not self.autoscale:
            raise ValueError(f"num_workers must be an int or 'auto', got {num_workers!r}")
        workers = self.options.autoscale.start_count() if self.autoscale else int(num_workers)
        if generator is None and self.options.seed is not None:
            generator = torch.Generator()
            generator.manual_seed(self.options.seed)
        self._torch = tud.DataLoader(
            dataset, batch_size, shuffle, sampler, batch_sampler, workers, collate_fn,
            pin_memory, drop_last, timeout, worker_init_fn, multiprocessing_context, generator,
            prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device, in_order=in_order,
        )
        t = self._torch
        self.dataset = dataset
        self.batch_size = t.batch_size
        self.drop_last = t.drop_last
        self.sampler = t.sampler
        self.batch_sampler = t.batch_sampler
        self.num_workers = workers
        self.collate_fn = t.collate_fn
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = t.multiprocessing_context
        self.generator = generator
        self.prefetch_factor = t.prefetch_factor
        self.persistent_workers = persistent_workers
        self.in_order = in_order
        self._iterable = isinstance(dataset, tud.IterableDataset)
        if self.options.executor == "threads" and workers:
            if self._iterable:
                raise ValueError("Options(executor='threads') needs a map-style dataset; an "
                                 "IterableDataset is iterated by torch's own worker processes")
            if worker_init_fn is not None:
                raise ValueError("worker_init_fn needs worker processes; with "
                                 "Options(executor='threads') there are none to initialise")
        if self.options.remote is not None and (self._iterable or not workers):
            raise ValueError("Options(remote=...) needs a map-style dataset and num_workers >= 1 "
                             "(remote workers join the local ones)")
        self.pipeline: Pipeline | None = None
        if not self._iterable:
            self.pipeline = dataset if isinstance(dataset, Pipeline) else Pipeline.from_dataset(dataset)
        self._user_batch_sampler = batch_sampler is not None
        self.monitor = Monitor(self.options, self.autoscale,
                               self.pipeline.step_names if self.pipeline is not None else None)
        self.planning = Planning(self.pipeline, self.options, self.monitor) if self.pipeline else None
        if self.planning is not None:
            self.monitor.epoch_listeners.append(self.planning.after_epoch)
        self._epoch = 0
        self._base_seed: int | None = None
        self._pool: WorkerPool | None = None
        self._buffers = BufferPool()  # batch memory the training loop let go of, for reuse
        self._iterator_ref: Callable[[], Any] = lambda: None
        self._resume: checkpoint.ResumePoint | None = None
        self._finalizer = weakref.finalize(self, _close_pool, [None])
        self.remote = remote_session(self.options.remote, self.monitor)
        """Remote workers (``headrace.remote``), or None without ``Options(remote=...)``."""

    # -- torch API -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._torch)

    def __iter__(self) -> Iterator[Any]:
        if self._iterable:
            return iter(self._torch)
        old = self._iterator_ref()
        if old is not None:
            old.close()  # a new epoch abandons the previous one, as torch does
        it = self._start_epoch()
        it.loader = self  # the epoch keeps its loader (and a persistent pool) alive, not the reverse
        self._iterator_ref = weakref.ref(it)  # weak: `break` must let the epoch be collected
        return it

    @property
    def _auto_collation(self) -> bool:
        return self._torch._auto_collation

    # -- headrace API --------------------------------------------------------------------------
    def stats(self) -> LoaderStats:
        """Per-epoch wall, stall, throughput, lanes, timeout, workers, queues (see LoaderStats)."""
        it = self._iterator_ref()
        epochs: tuple[EpochStats, ...] = tuple(self.monitor.epochs)
        if it is not None and not it.closed:
            epochs += (it.stats(),)
        pol = self.monitor.timeout
        pct = pol.config.fallback_percentile if pol.using_fallback else pol.config.percentile
        pool = self._pool if self._pool is not None else getattr(it, "pool", None)
        return LoaderStats(
            epochs=epochs,
            timeout_s=pol.timeout_s,
            timeout_percentile=pct,
            workers=pool.size if pool is not None else 0,
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
        the training script restores that generator as it does for its model.
        """
        if self.pipeline is None:
            raise StateDictError("state_dict is not supported for an IterableDataset")
        it = self._iterator_ref()
        if it is not None and not it.closed:
            origin, delivered, epoch = it.origin, it.delivered, it.origin.epoch
        elif self._resume is not None:
            origin, delivered, epoch = self._resume.origin, self._resume.delivered, self._resume.epoch
        else:
            origin, delivered, epoch = None, None, self._epoch
        persistent = self._base_seed if self.persistent_workers else None
        return checkpoint.build(self.pipeline.fingerprint(), len(self), epoch, origin, delivered,
                                self.generator, persistent)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``: the next ``iter()`` delivers exactly what was left.

        Rejects a state from another dataset, pipeline or batch layout with a clear error.
        """
        if self.pipeline is None:
            raise StateDictError("load_state_dict is not supported for an IterableDataset")
        point = checkpoint.parse(state, self.pipeline.fingerprint(), len(self))
        it = self._iterator_ref()
        if it is not None:
            it.close()
        self._epoch = point.epoch
        if point.persistent_base_seed is not None:
            self._base_seed = point.persistent_base_seed
        if not point.in_epoch and point.generator_state is not None and self.generator is not None:
            self.generator.set_state(point.generator_state)
        self._resume = point if point.in_epoch else None

    def explain(self) -> str:
        """Every decision headrace made for this loader and the measured numbers behind it."""
        if self.pipeline is None or self.planning is None:
            return "headrace: an IterableDataset is iterated exactly as torch does; nothing to plan"
        pl = self.planning
        return explain_text(Facts(
            fingerprint=self.pipeline.fingerprint(),
            samples=len(self.pipeline),
            batch_size=self.batch_size,
            workers="auto" if self.autoscale else self.num_workers,
            in_order=self.in_order,
            declared=tuple(self.pipeline.step_names),
            executed=tuple(pl.executed.step_names),
            order=pl.order,
            next_order=pl.decide(),
            handoff=self.options.handoff and len(self.pipeline.step_names) > 1 and self.num_workers > 0,
            stats=self.stats(),
            timeout_samples=len(self.monitor.timeout._times),
            scale_decisions=tuple(self.monitor.scaler.decisions) if self.monitor.scaler else (),
            profile=pl.profile(),
            profile_note=pl.note + (f"; kept in {pl.store.path}" if pl.store is not None else ""),
            remote=self._remote_facts(),
        ))

    def _remote_facts(self) -> Any:
        if self.remote is None or not self.remote._opened:
            return None
        it = self._iterator_ref()
        pool = it.pool if it is not None and hasattr(it, "pool") else self._pool
        last = self.monitor.epochs[-1] if self.monitor.epochs else None
        assert self.planning is not None
        return self.remote.facts(pool, self.planning.executed.step_names,
                                 last.samples_per_s if last is not None else None)

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
        """Stop the running epoch and every worker (also done on ``del`` and at exit)."""
        it = self._iterator_ref()
        if it is not None:
            it.close()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    # -- epochs --------------------------------------------------------------------------------
    def _draw_epoch(self, replay: EpochOrigin | None = None) -> tuple[EpochOrigin, Iterator[Any]]:
        """Sampler stream and base seed, drawing random numbers in torch's own order.

        The sampler's first element is taken here, in the training thread, because samplers
        draw their permutation lazily from the RNG: done later in the scheduler thread it would
        race the training loop's own use of torch's global generator.
        ``replay`` redraws a saved epoch from its saved RNG state (exact resume).
        """
        user_rng = None
        if replay is not None:
            if self.generator is not None:
                self.generator.set_state(replay.rng)
            else:
                user_rng = torch.get_rng_state()
                torch.set_rng_state(replay.rng)
            if not replay.drew_base_seed:
                self._base_seed = replay.base_seed
        try:
            rng = capture_rng(self.generator)
            sampler_iter = iter(self._torch._index_sampler)
            drew = self._base_seed is None or not self.persistent_workers
            if drew:
                self._base_seed = int(
                    torch.empty((), dtype=torch.int64).random_(generator=self.generator).item()
                )
            first = next(sampler_iter, _END)
        finally:
            if user_rng is not None:
                torch.set_rng_state(user_rng)  # the training loop's RNG is not ours to move
        assert self._base_seed is not None
        if replay is not None and self._base_seed != replay.base_seed:
            raise StateDictError(
                "replaying the saved epoch drew another base seed: the sampler or generator "
                "does not reproduce its order from the saved RNG state"
            )
        origin = EpochOrigin(self._epoch, rng, self._base_seed, drew)
        groups = sampler_iter if first is _END else itertools.chain([first], sampler_iter)
        return origin, groups

    def _batch_mode(self) -> Mode:
        if self.in_order:
            return "ordered"
        if self._auto_collation and not self._user_batch_sampler:
            return "regroup"
        return "grouped"

    def _pin(self) -> Callable[[Any], Any] | None:
        if not self.pin_memory:
            return None
        if not torch.accelerator.is_available():
            warnings.warn(  # torch's own words, at the same moment (iterator creation)
                "'pin_memory' argument is set as true but no accelerator is found, "
                "then device pinned memory won't be used.",
                stacklevel=3,
            )
            return None
        acc = torch.accelerator.current_accelerator()
        device = acc.type if acc is not None else None
        return lambda b: _pin_memory(b, device)

    def _total_positions(self) -> int | None:
        try:
            if not self._auto_collation:
                return len(self._torch._index_sampler)
            if self._user_batch_sampler:
                return None
            n = len(self.sampler)  # type: ignore[arg-type]
            bs = self.batch_size or 1
            return n - n % bs if self.drop_last else n
        except TypeError:
            return None

    def _start_epoch(self) -> Any:
        assert self.pipeline is not None and self.planning is not None
        if self.planning.before_epoch() and self._pool is not None:
            self._pool.shutdown()  # persistent workers run the old order: restart them
            self._pool = None
        resume, self._resume = self._resume, None
        replay = resume.origin if resume is not None else None
        if replay is not None:
            self._epoch = replay.epoch
        origin, groups = self._draw_epoch(replay)
        epoch, base_seed = origin.epoch, origin.base_seed
        self._epoch = epoch + 1
        delivered = resume.delivered if resume is not None else Bitmap()
        it = self._make_iterator(epoch, base_seed, groups, delivered)
        it.origin = origin
        return it

    def _make_iterator(self, epoch: int, base_seed: int, groups: Iterator[Any], delivered: Bitmap) -> Any:
        assert self.pipeline is not None and self.planning is not None
        opts = self.options
        if self.num_workers == 0:
            return InProcessIterator(
                self.planning.executed, epoch, base_seed, groups, self._auto_collation,
                self.collate_fn, self._pin(), delivered, opts.on_error, self.monitor,
                measure=sizes.measure if opts.profile else None,
            )
        pool, owns = self._get_pool(base_seed)
        bs = self.batch_size or 1
        hi = self.options.autoscale.bounds()[1] if self.autoscale else self.num_workers
        if self.remote is not None and self.remote.available:
            hi += self.remote.max_workers  # remote workers need samples in flight too
        max_in_flight = opts.max_in_flight or default_max_in_flight(
            bs, hi, self.prefetch_factor or 2)
        spec = EpochSpec(
            epoch=epoch,
            base_seed=base_seed,
            groups=groups,
            auto_collation=self._auto_collation,
            batcher=Batcher(self._batch_mode(), self.batch_size),
            collate=self.collate_fn,
            pin=self._pin(),
            max_in_flight=max_in_flight,
            handoff=opts.handoff and len(self.pipeline.step_names) > 1,
            slow_lane_share=opts.slow_lane_share,
            on_error=opts.on_error,
            max_restarts=opts.max_worker_restarts,
            delivered=delivered,
            total_positions=self._total_positions(),
            sample_timeout_s=opts.sample_timeout_s,
            buffers=self._buffers,
        )
        it = EpochIterator(pool, owns, spec, self.monitor, delivered, self.timeout)
        if not pool.workers:
            # Fork after the scheduler started: it feeds the first workers while later ones fork.
            pool.start(self.num_workers, on_added=it.scheduler.wake)
            if self.remote is not None:
                self.remote.attach(pool, on_added=it.scheduler.wake)
            self.monitor.record_workers(pool.size)
        return it

    def _get_pool(self, base_seed: int) -> tuple[WorkerPool, bool]:
        if self._pool is not None:
            return self._pool, False
        assert self.pipeline is not None
        ctx = self.multiprocessing_context or torch.multiprocessing.get_context()
        hi = self.options.autoscale.slot_bound() if self.autoscale else self.num_workers
        if self.remote is not None:
            hi += self.remote.open()  # joins the cluster on the first epoch
        assert self.planning is not None
        pool = WorkerPool(self.planning.executed, self.dataset, ctx, self.worker_init_fn,
                          base_seed, hi, profile=self.options.profile,
                          executor=self.options.executor)
        if self.persistent_workers:
            self._pool = pool
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _close_pool, [pool])
            return pool, False
        return pool, True


_END = object()


def _close_pool(holder: list[WorkerPool | None]) -> None:
    for pool in holder:
        if pool is not None:
            pool.shutdown()
