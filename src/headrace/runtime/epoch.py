"""The training loop's side of one epoch: take batches, measure stalls, mark delivery.

``EpochIterator`` reads what the scheduler thread (``runtime/scheduler.py``) produces. It is the
only writer of the delivered bitmap, so a ``state_dict()`` taken between two ``next()`` calls is
exact. A batch is marked when it reaches the training loop (``mark``), not when it is taken
from the scheduler (``take``): the device prefetcher (``runtime/prefetch.py``) takes batches
ahead, and those are not delivered yet. Shutdown: see NOTE [headrace shutdown] in ``runtime/pool.py``.
"""

from __future__ import annotations

import queue
import time
from typing import Any

from headrace.errors import StepError
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.feed import Feed
from headrace.runtime.output import WAKE_UPS
from headrace.runtime.pool import WorkerPool
from headrace.runtime.scheduler import Scheduler
from headrace.runtime.work import EpochSpec
from headrace.telemetry.stats import EpochStats

GET_POLL_S = 0.5
"""How often a waiting ``next()`` checks that the scheduler thread is alive (seconds)."""


class EpochMeter:
    """Wall time, stall and CPU of one epoch as the training loop sees it."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.t_start = time.perf_counter()
        self.t_end: float | None = None
        self.stall_s = 0.0
        self.batches = 0
        self.samples = 0
        self.consumer_cpu_s = 0.0

    def snapshot(
        self, fast: int, slow: int, skipped: int, retried: int, scheduler_cpu_s: float,
        moved: int = 0, failed: int = 0, shared: int = 0, dropped: int = 0,
    ) -> EpochStats:
        end = self.t_end if self.t_end is not None else time.perf_counter()
        wall = end - self.t_start
        cpu = self.consumer_cpu_s + scheduler_cpu_s
        return EpochStats(
            epoch=self.epoch,
            wall_s=wall,
            stall_s=self.stall_s,
            batches=self.batches,
            samples=self.samples,
            samples_per_s=self.samples / wall if wall > 0 else 0.0,
            fast_samples=fast,
            slow_samples=slow,
            skipped_samples=skipped,
            retried_samples=retried,
            main_cpu_per_batch_ms=1000.0 * cpu / self.batches if self.batches else 0.0,
            finished=self.t_end is not None,
            moved_samples=moved,
            failed_samples=failed,
            shared_samples=shared,
            dropped_samples=dropped,
        )


class EpochBase:
    """What every epoch iterator shares: its meter, origin, closing protocol.

    Subclasses implement ``__next__``, ``stats`` and ``_release`` (free what the epoch holds).
    ``origin`` (a ``checkpoint.EpochOrigin``) and ``loader`` (kept alive while the epoch runs)
    are set by the loader.
    """

    def __init__(self, epoch: int, hooks: Any, delivered: Bitmap) -> None:
        self.meter = EpochMeter(epoch)
        self.hooks = hooks
        self.delivered = delivered
        self.ods: Any = None  # cache.ods_epoch.OdsEpoch: delivered is then by sample index
        self.origin: Any = None
        self.steps: tuple[str, ...] = ()  # the step order this epoch runs (set by the loader)
        self.loader: Any = None
        self.empty_batches = 0  # a batch sampler's empty batches delivered (before a resume too)
        self._closed = False
        self._replaced = False

    def __iter__(self) -> EpochBase:
        return self

    def __len__(self) -> int:
        """Batches in an epoch of the loader (torch's iterators answer ``len()`` the same way)."""
        return len(self.loader) if self.loader is not None else 0

    def _check_open(self) -> None:
        """``StopIteration`` once closed; a clear error if a newer ``iter(loader)`` took this
        epoch's persistent workers (torch would silently reset the shared iterator)."""
        if self._replaced:
            raise RuntimeError(
                "this DataLoader iterator was replaced by a newer iter(loader): with "
                "persistent_workers=True the workers are shared, so only the newest iterator "
                "runs. Finish one epoch before starting the next, or use "
                "persistent_workers=False for independent iterators")
        raise StopIteration

    def __next__(self) -> Any:
        got = self.take()
        assert got is not None  # a blocking take returns a batch or raises
        self.mark(got[1])
        return got[0]

    def take(self, block: bool = True) -> tuple[Any, Any] | None:
        """The next batch and its positions, not yet delivered (``mark`` delivers it).

        ``block=False``: ``None`` when no batch is ready yet or the epoch's end is next (the
        end is then kept for the next blocking call). Raises ``StopIteration`` at the end.
        """
        raise NotImplementedError

    def mark(self, positions: Any) -> None:
        """The batch at ``positions`` reached the training loop: it is delivered."""
        if not positions:  # a batch sampler's empty batch: counted, a resume skips as many
            self.empty_batches += 1
        for p in positions:
            self.delivered.set(p if self.ods is None else self.ods.index_of(p))
        self.meter.batches += 1
        self.meter.samples += len(positions)

    def stats(self) -> EpochStats:
        raise NotImplementedError

    def _release(self) -> None:
        """Free what the epoch holds (threads, workers); called once by ``close``."""

    @property
    def finished(self) -> bool:
        return self.meter.t_end is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, replaced: bool = False) -> None:
        """Release the epoch and record its stats (idempotent). ``replaced``: a newer iterator
        took its persistent workers over; advancing this one then raises."""
        if self._closed:
            return
        self._closed = True
        self._replaced = replaced
        self._release()
        if self.loader is not None and not self.finished:
            self.loader._abandoned(self)  # state_dict() still describes this epoch
        self.hooks.on_epoch_closed(self.stats())

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class EpochIterator(EpochBase):
    """Iterator over the batches of one epoch with worker processes."""

    def __init__(
        self,
        pool: WorkerPool,
        owns_pool: bool,
        spec: EpochSpec,
        hooks: Any,
        delivered: Bitmap,
        timeout_s: float,
    ) -> None:
        super().__init__(spec.epoch, hooks, delivered)
        self.pool = pool
        self.owns_pool = owns_pool
        self.spec = spec
        self.timeout_s = timeout_s
        self._out: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self._held: tuple[str, Any, Any] | None = None  # seen by a non-blocking take, for later
        self._raised = 0  # samples of batches whose collate_fn raised in the training loop
        self._empty = 0  # empty batches (a batch sampler's) delivered in this run
        self.feed = spec.groups if isinstance(spec.groups, Feed) else None
        out = self._out  # (the queue alone: a reference to self would be a cycle)
        if self.feed is not None:  # the scheduler found nothing fed: read more at the next turn
            self.feed.on_empty = lambda: out.put(("feed", None, None))
        # a worker to fork on this thread (runtime/forks.py): when no batch is ready, or soon
        pool.requests.on_asked = lambda: out.put(("start", None, None))
        self.scheduler = Scheduler(pool, spec, hooks, self._out)
        self.scheduler.start()

    def mark(self, positions: Any) -> None:
        # the sampler first: a read interrupted there (Ctrl-C) leaves this batch undelivered,
        # where marking first lost it (delivered for state_dict(), never returned)
        try:
            self._top_up(len(positions) or 1, wake=True, leaving=True)
            if not positions:
                self._empty += 1
            super().mark(positions)
        finally:  # next() returns (or raises) now: the woken scheduler may take the GIL
            self.scheduler.left()

    def _top_up(self, delivering: int = 0, wake: bool = False, leaving: bool = False) -> None:
        """Read the sampler in this (the training) thread for the room the settled samples
        left (``runtime/feed.py``), and let the scheduler dispatch what came (``wake``: in any
        case, samples having left; ``leaving``: from ``mark``, on the way out of ``next()``,
        which then calls ``Scheduler.left``). Settled: as the scheduler counts them out of
        flight, but for batches taken and not yet delivered (the device prefetcher's), so the
        count follows deliveries, not timing; an empty batch counts as one (as the feed counts
        it); ``delivering``: the batch being delivered.

        The one wake-up a batch gives the scheduler: taking a batch gives none, since what
        the scheduler may dispatch is what the feed holds, and the feed grows here (a wake at
        ``take`` as well woke it twice a batch, the first time to find nothing to pull)."""
        c = self.scheduler.counters
        if self.feed is not None and self.feed.top_up(
                self.meter.samples + self._empty + self._raised + delivering + c.skipped
                + c.failed + c.discarded) or wake:
            self.scheduler.room_freed(leaving)

    def take(self, block: bool = True) -> tuple[Any, Any] | None:
        if self._closed:
            self._check_open()
        c0 = time.thread_time()
        item, self._held = self._held, None
        deadline = None  # of loader.timeout: one for the whole wait, whatever wakes it meanwhile
        # "feed": the scheduler asks for the sampler; "start": for workers to fork (forks.py),
        # forked when this thread would wait (not a non-blocking take: the device prefetcher's)
        while item is None or item[0] in WAKE_UPS:
            asked = self.pool.requests
            if asked and asked.due(idle=block and self._out.empty()):  # (rarely anything asked)
                self.pool.start_requested(on_added=self.scheduler.wake)
            if item is not None and item[0] == "feed":
                self._top_up()
            try:
                item = self._out.get_nowait()
            except queue.Empty:
                if not block:
                    return None
                if deadline is None and self.timeout_s > 0:
                    deadline = time.monotonic() + self.timeout_s
                t0 = time.perf_counter()
                item = self._get_blocking(deadline)
                self.meter.stall_s += time.perf_counter() - t0
        kind, value, positions = item
        if kind in ("future", "deferred"):  # a user collate_fn's batch (runtime/output.py)
            if kind == "future" and not block and not value.done():
                self._held = item
                return None
            t0 = time.perf_counter()
            try:
                value = value.result() if kind == "future" else value()
            except StepError:
                self.scheduler.consumed += len(positions)  # its samples leave with its error
                self._raised += len(positions) or 1  # (an empty batch counts as one)
                self._top_up(wake=True)
                value = item = None  # held by the error's traceback: a cycle through the future
                raise
            finally:
                self.meter.stall_s += time.perf_counter() - t0
            kind = "batch"
        if kind == "batch":
            self.scheduler.consumed += len(positions)  # the scheduler is woken at ``mark``
            self.meter.consumer_cpu_s += time.thread_time() - c0
            return value, positions
        if not block:
            self._held = item  # the end, or an error, comes after the batches taken ahead
            return None
        if kind == "raise":  # one sample's (or batch's) error: raised, and the epoch goes on
            self.meter.consumer_cpu_s += time.thread_time() - c0
        elif kind == "end":
            self.meter.t_end = time.perf_counter()
            self.close()
            raise StopIteration
        else:  # an error that ends the epoch (the sampler's): unfinished, so state_dict()
            self.close()  # still describes it and a resume delivers the rest
        try:
            raise value
        finally:  # this frame is in the error's traceback: it must not hold the error itself
            value = item = None

    def _get_blocking(self, deadline: float | None) -> tuple[str, Any, Any]:
        """The next item of the queue; ``deadline``: ``time.monotonic()`` at which the loader's
        ``timeout`` raises (None: never)."""
        while True:
            wait = GET_POLL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    self.close()
                    raise RuntimeError(
                        f"DataLoader timed out after {self.timeout_s} seconds waiting for a batch"
                    )
            try:
                return self._out.get(timeout=wait)
            except queue.Empty:
                pass  # checked outside the handler: a Ctrl-C there printed the Empty as its cause
            if not self.scheduler._thread.is_alive() and self._out.empty():
                self.close()
                raise RuntimeError("headrace scheduler thread stopped unexpectedly")

    def stats(self) -> EpochStats:
        c = self.scheduler.counters
        return self.meter.snapshot(c.fast, c.slow, c.skipped, c.retried, c.scheduler_cpu_s, c.moved,
                                   c.failed, c.shared_samples, c.dropped)

    def _release(self) -> None:
        """Stop the scheduler; stop the workers unless they persist; drop what it queued and
        nobody will take (batches, an error whose traceback holds the scheduler's frames)."""
        self.scheduler.stop()
        self._held = None
        while True:
            try:
                self._out.get_nowait()
            except queue.Empty:
                break
        if self.spec.buffers is not None:
            self.spec.buffers.trim()  # idle batch memory goes back between epochs
        if self.owns_pool:
            self.pool.shutdown()
        else:
            self._drop_assignments()

    def _drop_assignments(self) -> None:
        """Persistent workers outlive the epoch: forget samples still assigned to them.

        Their results may still arrive; the next epoch's scheduler ignores tids it does not know.
        """
        for w in self.pool.workers.values():
            w.assigned.clear()
