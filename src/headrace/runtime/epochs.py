"""How ``iter(loader)`` becomes a running epoch: draw the order and base seed in torch's
order (``runtime/drawing.py``), choose the step order, the batching and the worker pool, and
build the epoch iterator.

Called by ``runtime/loader.py`` (``DataLoader.__iter__``); functions over the loader, whose
attributes are torch's arguments and headrace's runtime state.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from headrace.planner.workers import epoch_workers
from headrace.profiler import sizes
from headrace.runtime import distributed, ordering, padding, sampler_seeds
from headrace.runtime.batcher import Batcher, Mode
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.collate_rng import place_for
from headrace.runtime.drawing import FirstAtNext, draw_epoch, origin_setter, skip_empty
from headrace.runtime.draws import may_repeat
from headrace.runtime.epoch import EpochIterator
from headrace.runtime.feed import Feed
from headrace.runtime.inprocess import InProcessIterator
from headrace.runtime.order_digest import OrderDigest
from headrace.runtime.pin_arguments import pin_fn
from headrace.runtime.pool import WorkerPool
from headrace.runtime.span import covers, length_or_none, total_positions
from headrace.runtime.work import EpochSpec, default_max_in_flight

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader

log = logging.getLogger("headrace")


def batch_mode(loader: DataLoader) -> Mode:
    """The batcher's mode for this loader's arguments (``runtime/ordering.py``)."""
    return ordering.batch_mode(loader.in_order, loader._index_sampler, loader._auto_collation,
                               loader._user_batch_sampler)


def warn_inert_timeouts(loader: DataLoader) -> None:
    """At ``iter()``: warn of the timeouts ``num_workers=0`` cannot apply (samples run inside
    ``next()``, in the training thread): ``timeout=``, where torch's ``iter()`` raises (README:
    differences), and ``Options(sample_timeout_s=)``, which a hung step would ignore."""
    if loader.num_workers:
        return
    if loader.timeout:
        warnings.warn(
            f"headrace: timeout={loader.timeout} has no effect with num_workers=0 (samples load "
            "inside next(), no worker is waited for); torch's DataLoader raises here "
            "(AssertionError: _SingleProcessDataLoaderIter requires timeout == 0), headrace "
            "runs the epoch without a timeout", UserWarning, stacklevel=3)
    if loader.options.sample_timeout_s is not None:
        warnings.warn(
            f"headrace: Options(sample_timeout_s={loader.options.sample_timeout_s}) has no "
            "effect with num_workers=0: samples run in this thread, where a hung step "
            "cannot be stopped; it applies to worker processes", UserWarning, stacklevel=3)


def start_epoch(loader: DataLoader) -> Any:
    """A new epoch (or the rest of a resumed one): its step order, order and seeds, iterator.
    Its clock starts here (``EpochMeter.began``): ``EpochStats.wall_s`` is from ``iter()``."""
    t0 = time.perf_counter()
    assert loader.pipeline is not None and loader.planning is not None
    restart = loader.planning.before_epoch()  # persistent workers run the old order
    d = loader.monitor.executor_decision
    if d is not None and d.executor != loader._executor:  # executor="auto" decided
        loader._executor = d.executor
        loader.monitor.use_executor(d.executor)
        restart = True
    if restart and loader._pool is not None:
        loader._pool.shutdown()
        loader._pool = None
    resume, loader._resume, loader._unfinished = loader._resume, None, None
    replay = resume.origin if resume is not None else None
    if replay is not None:
        loader._epoch = replay.epoch
    origin, groups = draw_epoch(loader, replay)
    lazy = groups if isinstance(groups, FirstAtNext) else None
    pads = distributed.needs_even_batches(loader._index_sampler, loader.options.on_error)
    length = length_or_none(loader) if pads else None
    owed = (padding.owed_at_resume(length, pads, resume.delivered.count, resume.batches)
            if resume is not None else 0)
    if resume is not None and covers(loader, resume.delivered.count, resume.positions_read, owed):
        # a state taken after the epoch's last batch, before its end was seen (Lightning knows
        # len(loader) and asks no further): that epoch is done, and this iter() is the next
        # one. It gave an empty epoch: a run resumed from a checkpoint written at an epoch's
        # last step lost a whole epoch of steps. The replay's sampler is read to its end, as
        # the rest of that epoch would have been (a sampler drawing as it goes draws the same).
        # Not where the saved epoch's sampler had given more than its __len__ said (an
        # oversampler): it went on past that length, and its rest is resumed (span.covers)
        for _ in groups:
            pass
        resume = None
        loader._epoch = origin.epoch + 1
        origin, groups = draw_epoch(loader)
        lazy = groups if isinstance(groups, FirstAtNext) else None
    # the positions read and their digest, compared with the saved epoch's (runtime/order_digest.py)
    saved = resume.origin.order if resume is not None and resume.origin is not None else None
    order = OrderDigest(saved.saved(resume.delivered.end())  # (under ODS: no order to keep)
                        if saved is not None and resume is not None
                        and not delivered_by_index(loader) else None,
                        sampler_seeds.unrecorded(loader._index_sampler, resume.origin.sampler_seeds)
                        if resume is not None and resume.origin is not None else None)
    groups = order.wrap(groups, loader._auto_collation)
    pad = padding.Padding(length) if length is not None else None
    if pad is not None and resume is not None and resume.last_batch:  # its repeat, if it owes
        pad.last = resume.last_batch  # one and delivers nothing more (runtime/padding.py)
        if not delivered_by_index(loader):
            groups = pad.watch = padding.LastBatchIndices(
                groups, resume.last_batch, loader._auto_collation,
                may_repeat(loader.sampler, loader._user_batch_sampler))
    origin = dataclasses.replace(origin, order=order)
    epoch, base_seed = origin.epoch, origin.base_seed
    loader._epoch = epoch + 1
    delivered = resume.delivered if resume is not None else Bitmap()
    empty = resume.empty_batches if resume is not None else 0
    it = make_iterator(loader, epoch, base_seed, skip_empty(groups, empty, loader), delivered)
    it.empty_batches = empty
    it.batches_before = resume.batches if resume is not None else 0
    it.padding = pad
    it.origin = origin
    it.steps = loader.planning.executed_names
    if lazy is not None:  # the sampler's first read, at the first next(): the origin it read
        lazy.on_first = origin_setter(weakref.ref(it))  # (the epoch holds the sampler)
    it.meter.began(t0)
    return it


def make_iterator(
    loader: DataLoader, epoch: int, base_seed: int, groups: Iterator[Any], delivered: Bitmap
) -> Any:
    """The epoch iterator: in this process (``num_workers=0``) or fed by the worker pool."""
    assert loader.pipeline is not None and loader.planning is not None
    opts = loader.options
    ods = start_cache(loader, epoch, delivered)
    if loader.num_workers == 0:
        return InProcessIterator(
            loader.planning.executed, epoch, base_seed, groups, loader._auto_collation,
            loader.collate_fn, pin_fn(loader), delivered, opts.on_error, loader.monitor,
            measure=sizes.measure if opts.profile else None,
            cache=loader.cache.client() if loader.cache else None,
            cache_row=loader.cache.row if loader.cache else 0, ods=ods,
            may_repeat=may_repeat(loader.sampler, loader._user_batch_sampler),
            # sample-aware batching, as with workers: a failing sample leaves its batch-mates
            # to the next batch (they went with it: a bug hunt), and a resumed epoch (saved
            # with workers, out of order) has holes in every sampler batch, filled across them;
            # without a failure or a hole, the sampler's batches
            regroup=(loader.batch_size or 0) if batch_mode(loader) == "regroup" else 0,
            drop_last=loader.drop_last,
        )
    pin = pin_fn(loader)  # before loader._buffers is read: it may switch to pinned memory
    loader._collate_place = place_for(loader.collate_fn, loader._collate_place)
    # worker threads share the training process's generators and draw from them whenever
    # they run: no window could be seeded for a collate_fn alone (docs/design.md)
    place = loader._collate_place if loader._executor != "threads" else None
    pool, owns = get_pool(loader, base_seed)
    max_in_flight = opts.max_in_flight or in_flight_bound(loader)
    if batch_mode(loader) == "regroup":  # finished samples wait in flight for their batch:
        # under a batch of them, none fills and the sampler is read no further (a hang)
        max_in_flight = max(max_in_flight, loader.batch_size or 1)
    # the sampler is read in this (the training) thread, now and as batches are delivered;
    # a user batch sampler's batches, whole, in batches (torch's read-ahead, whatever their size)
    per_batch = (loader._user_batch_sampler and loader._auto_collation
                 and not opts.max_in_flight)
    batch_bound = in_flight_batches(loader) if per_batch else None
    feed = Feed(groups, loader._auto_collation, batch_bound or max_in_flight,
                runs_after_resume(delivered, ods), per_batch=per_batch)
    feed.top_up(0)
    spec = EpochSpec(
        epoch=epoch,
        base_seed=base_seed,
        groups=feed,
        auto_collation=loader._auto_collation,
        # a resumed epoch's batches are numbered past those it delivered (at most one per
        # delivered sample): a collate_fn seeded by number repeated their draws
        batcher=Batcher(batch_mode(loader), loader.batch_size, loader.drop_last,
                        first_key=delivered.count),
        collate=loader.collate_fn,
        pin=pin,
        max_in_flight=max_in_flight,
        handoff=opts.handoff and loader.pipeline.splittable,
        slow_lane_share=opts.slow_lane_share,
        on_error=opts.on_error,
        max_restarts=opts.max_worker_restarts,
        delivered=delivered,
        total_positions=total_positions(loader),
        sample_timeout_s=opts.sample_timeout_s,
        buffers=loader._buffers,
        ods=ods,
        collate_threads=opts.collate_threads,
        may_repeat=may_repeat(loader.sampler, loader._user_batch_sampler),
        collate_place=place,
        batch_bound=batch_bound,
    )
    it = EpochIterator(pool, owns, spec, loader.monitor, delivered, loader.timeout)
    loader.monitor.meter = it.meter
    it.ods = ods
    if not pool.workers:
        # Fork after the scheduler started: it feeds the first workers while later ones fork.
        # num_workers="auto" starts where the last epoch's scaler left off (the first epoch:
        # where a stored profile says the cores stay busy), not from scratch.
        # what the epoch can keep busy: more would hold no sample (the scaler's cap too)
        most = epoch_workers(total_positions(loader), max_in_flight)
        n = (loader.monitor.start_workers(loader.num_workers, most) if loader.autoscale
             else loader.num_workers)
        pool.start(n, on_added=it.scheduler.wake)
        if loader.remote is not None:
            loader.remote.attach(pool, on_added=it.scheduler.wake)
        loader.monitor.record_workers(pool.own_workers)  # the local ones: where the next
        # epoch starts (Monitor.start_workers), not the remote ones attach started
    return it


def delivered_by_index(loader: DataLoader) -> bool:
    """Whether the epoch records what it delivered by sample index (ODS runs: ``Cache(ods=True)``
    with a sampler it can serve), not by position in the sampler's order."""
    return (loader.cache is not None and loader.cache.config.ods
            and ods_eligible(loader) is None)


def ods_eligible(loader: DataLoader) -> str | None:
    """Why ODS cannot run with this loader's sampler (``cache/ods.py``); None: it can."""
    from headrace.cache.ods import eligible

    assert loader.pipeline is not None
    n = loader.pipeline.length()
    if n is None:
        return "a dataset without __len__"
    return eligible(loader.sampler, loader._user_batch_sampler, loader.drop_last,
                    loader.batch_size, n)


def local_slots(loader: DataLoader) -> int:
    """Slots of the loader's own (local) workers: ``num_workers``, or the autoscaler's bound.
    The sample cache's counters have a row for each and one more, the training process's
    (``cache/session.py``); remote workers get slots after them (``WorkerPool``)."""
    return loader.options.autoscale.slot_bound() if loader.autoscale else loader.num_workers


def get_pool(loader: DataLoader, base_seed: int) -> tuple[WorkerPool, bool]:
    """The worker pool and whether the epoch owns it (``False``: persistent workers)."""
    if loader._pool is not None:  # persistent: the epoch's cache for the workers it starts
        loader._pool.cache = loader.cache.client() if loader.cache else None  # (epoch_client.py)
        return loader._pool, False
    assert loader.pipeline is not None
    ctx = loader.multiprocessing_context or torch.multiprocessing.get_context()
    hi = local_slots(loader)
    remote = loader.remote.open() if loader.remote is not None else 0  # joins on the first epoch
    assert loader.planning is not None
    profile: bool | str = loader.options.profile
    if loader.remote is not None:  # near storage: its controller, every sample's sizes
        profile = loader.remote.prepare(loader.planning.executed, loader.num_workers, profile)
    pool = WorkerPool(loader.planning.executed, loader.dataset, ctx, loader.worker_init_fn,
                      base_seed, hi + remote, profile=profile, backend_slots=remote,
                      executor=loader._executor,
                      probe_gil=loader.monitor.probe_gil and loader.monitor.executor_decision is None,
                      blas_threads=loader.options.worker_blas_threads,
                      cache=loader.cache.client() if loader.cache else None)
    if loader.persistent_workers:
        loader._pool = pool
        loader._finalizer.detach()
        loader._finalizer = weakref.finalize(loader, close_pool, [pool])
        return pool, False
    return pool, True



def close_pool(holder: list[WorkerPool | None]) -> None:
    """The loader's finalizer: stop a persistent pool (see NOTE [headrace shutdown])."""
    for pool in holder:
        if pool is not None:
            pool.shutdown()


def in_flight_batches(loader: DataLoader) -> int:
    """Batches a user batch sampler is read ahead of those delivered or raised in the training
    loop: :func:`in_flight_bound` in batches, so torch's ``prefetch_factor × workers`` where
    that is torch's. Counted in samples from a guessed batch size (its ``batch_size``
    attribute, else 1), the read-ahead of a batch sampler without one, or of variable-size
    batches, was another number of batches than torch's: a batch sampler drawing from the
    global generator per batch, or choosing batches from the loop's feedback, gave other
    batches than torch's, also with ``in_order=True``. The samples in flight are bounded by
    it too (``EpochSpec.batch_bound``), not by the bound in samples."""
    bs = _batch_size(loader)
    return max(1, -(-in_flight_bound(loader) // bs))


def _batch_size(loader: DataLoader) -> int:
    bs = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None) or 1
    return bs if isinstance(bs, int) and bs >= 1 else 1


def in_flight_bound(loader: DataLoader) -> int:
    """Samples in flight at most by default (``Options(max_in_flight)`` overrides it), which is
    also how far ahead the training thread reads the sampler. Where batches keep torch's
    content (``in_order=True``, a non-random order, a user batch sampler) with a fixed worker
    count, torch's own ``prefetch_factor × workers`` batches, so the sampler is read exactly
    as far ahead as torch reads it (a sampler drawing random numbers then draws them at the
    same moments of the training loop); elsewhere ``default_max_in_flight``, which keeps a
    batch filling while another is out. A user batch sampler's batch size is its
    ``batch_size`` attribute where it has one (torch's ``BatchSampler``, Accelerate's shards):
    counted as one sample, it kept about one batch in flight where torch keeps four."""
    bs = _batch_size(loader)
    pf = loader.prefetch_factor or 2
    if batch_mode(loader) != "regroup" and not loader.autoscale and loader.remote is None:
        return pf * loader.num_workers * bs
    hi = loader.options.autoscale.bounds()[1] if loader.autoscale else loader.num_workers
    if loader.remote is not None and loader.remote.available:
        hi += loader.remote.max_workers  # remote workers need samples in flight too
    return default_max_in_flight(bs, hi, pf)


def start_cache(loader: DataLoader, epoch: int, delivered: Bitmap) -> Any:
    """Plan the cache for a starting epoch; its ``OdsEpoch`` (``None`` without ODS). A cache
    that fails here (a full ``/dev/shm``: LMDB's ``No space left on device``) is dropped with
    a warning and the epoch runs without it, as samples do when it fails under them; ODS,
    which changes what the state dict records, raises instead."""
    cache = loader.cache
    if cache is None:
        return None
    try:
        cache.begin_epoch()
        if cache.config.ods:
            cache.ods_off = ods_eligible(loader)
        assert loader.planning is not None
        cache.replan(loader.planning.executed, loader.planning.profile(), loader.num_workers,
                     loader.num_workers == 0)
        return cache.start_ods(epoch, delivered)
    except Exception as e:
        if cache.config.ods:
            raise
        log.warning("headrace: the cache failed (%s: %s); continuing without it",
                    type(e).__name__, e)
        loader.cache, loader._cache_off = None, f"it failed ({type(e).__name__}: {e})"
        if loader._pool is not None:  # persistent workers hold its client: new ones, without
            loader._pool.shutdown()
            loader._pool = None
        cache.drop()  # stats() keeps the numbers of the epochs it served
        loader._cache_dropped = cache
        return None


def runs_after_resume(delivered: Bitmap, ods: Any) -> Callable[[int, Any], bool] | None:
    """Whether the sample at (position, sampler index) runs in a resumed epoch, by the rule the
    scheduler applies (``Lanes.pull_group``): one not delivered before, by position, or by
    sampler index under ODS (``OdsEpoch.fill``); ``None`` when nothing was delivered before."""
    if ods is not None:
        resumed = ods.resumed
        return (lambda p, i: i not in resumed) if resumed.count else None
    return (lambda p, i: p not in delivered) if delivered.count else None
