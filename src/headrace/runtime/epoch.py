"""The training loop's side of one epoch: take batches, measure stalls, mark delivery.

``EpochIterator`` reads what the scheduler thread (``runtime/scheduler.py``) produces. It is the
only writer of the delivered bitmap, so a ``state_dict()`` taken between two ``next()`` calls is
exact. A batch is marked when it reaches the training loop (``mark``), not when it is taken
from the scheduler (``take``): the device prefetcher (``runtime/prefetch.py``) takes batches
ahead, and those are not delivered yet. Shutdown: see NOTE [headrace shutdown] in ``runtime/worker_stop.py``.

An interrupt (Ctrl-C) may come anywhere in ``next()``, and a notebook user reads the same
iterator on. CPython 3.11 runs a signal's handler, and so raises its exception, where a
function starts, where a loop jumps back and after a call into C code, never between two
plain stores nor on a Python function's return (measured: a handler raising on a timer in a
loop of calls). An item is held (``_held``) from the store right after it left the queue
until it is handed out, so a take interrupted meanwhile leaves it to the next one; a batch
interrupted in ``mark`` is unmarked and given back (``deliver``, ``give_back``). The scheduler counts the batches it queued (``Counters.batches_out``) and the
epoch the ones taken (``batches_taken``); at the end a difference (a batch lost inside
``queue.Queue.get``, after it left the queue) ends the epoch unfinished with an error. A
wake-up lost there is done once a wait found nothing for ``GET_POLL_S`` (``_get_blocking``).
"""

from __future__ import annotations

import queue
import time
from typing import Any

from headrace.errors import StepError
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.epoch_base import EpochBase
from headrace.runtime.feed import Feed
from headrace.runtime.output import WAKE_UPS
from headrace.runtime.pool import WorkerPool
from headrace.runtime.scheduler import Scheduler
from headrace.runtime.work import CutShort, EpochSpec
from headrace.telemetry.stats import EpochStats

GET_POLL_S = 0.5
"""How often a waiting ``next()`` checks that the scheduler thread is alive (seconds)."""


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
        self._raised_batches = 0  # batches raised in the training loop in their place
        self._cuts = CutShort()  # a "deferred" collation cut short (_collated)
        self.batches_taken = 0  # batches take() returned or raised (Counters.batches_out)
        self._empty = 0  # empty batches (a batch sampler's) delivered in this run
        self.feed = spec.groups if isinstance(spec.groups, Feed) else None
        out = self._out  # (the queue alone: a reference to self would be a cycle)
        if self.feed is not None:  # the scheduler found nothing fed: read more at the next turn
            self.feed.on_empty = lambda: out.put(("feed", None, None))
        # a worker to fork on this thread (runtime/forks.py): when no batch is ready, or soon
        pool.requests.on_asked = lambda: out.put(("start", None, None))
        self.scheduler = Scheduler(pool, spec, hooks, self._out)
        self.scheduler.start()

    def mark(self, positions: Any, keys: Any) -> None:
        # the sampler first: a read interrupted there (Ctrl-C) leaves this batch undelivered,
        # where marking first lost it (delivered for state_dict(), never returned)
        try:
            self._top_up(len(positions) or 1, wake=True, leaving=True)
        finally:  # next() returns (or raises) now: the woken scheduler may take the GIL
            self.scheduler.left()
        super().mark(positions, keys)  # last: nothing that can be interrupted comes after it
        if not positions:
            self._empty += 1

    def settled_undelivered(self) -> int:
        c = self.scheduler.counters
        return self._raised + c.skipped + c.failed + c.discarded

    def known_length(self) -> int | None:
        # the feed reads the sampler ahead of the deliveries, so its end is read by the time
        # the last batch is (at the latest in that batch's ``mark``)
        feed = self.feed
        return feed.positions if feed is not None and feed.read_to_end else None

    def give_back(self, batch: Any, positions: Any) -> None:
        self.batches_taken -= 1
        self.scheduler.consumed -= len(positions)
        self._held = ("batch", batch, positions)

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
        feed = self.feed
        if feed is None:
            settled = 0
        elif feed.per_batch:  # a user batch sampler: torch reads a batch per batch delivered
            # or raised in the loop (``_try_put_index``), whatever its size
            settled = (self.meter.batches + self._raised_batches + (1 if delivering else 0)
                       + c.batches_gone)
        else:
            settled = (self.meter.samples + self._empty + self._raised + delivering + c.skipped
                       + c.failed + c.discarded)
        if feed is not None and feed.top_up(settled) or wake:
            self.scheduler.room_freed(leaving)

    def take(self, block: bool = True) -> tuple[Any, Any] | None:
        if self._closed:
            self._check_open()
        c0 = time.thread_time()
        # ``_held``: an item that left the queue and was not handed out yet (set the moment it
        # left: an interrupt before it is returned or raised leaves it for the next take)
        item = self._held
        deadline = None  # of loader.timeout: one for the whole wait, whatever wakes it meanwhile
        # "feed": the scheduler asks for the sampler; "start": for workers to fork (forks.py),
        # forked when this thread would wait (not a non-blocking take: the device prefetcher's)
        while item is None or item[0] in WAKE_UPS:
            asked = self.pool.requests
            if asked and asked.due(idle=block and self._out.empty()):  # (rarely anything asked)
                self.pool.start_requested(on_added=self.scheduler.wake)
            if item is not None and item[0] == "feed":
                self._top_up()
            self._held = None  # the wake-up is done
            try:
                item = self._out.get_nowait()
            except queue.Empty:
                item = None  # waited for below, outside the handler: the timeout's error (or a
                # Ctrl-C) raised in the wait was chained to this Empty, two tracebacks for one
            if item is not None:
                self._held = item
                continue
            if not block:
                return None
            if deadline is None and self.timeout_s > 0:
                deadline = time.monotonic() + self.timeout_s
            t0 = time.perf_counter()
            item = self._get_blocking(deadline)
            self._held = item  # (no call between: no interrupt lands between them)
            self.meter.stall_s += time.perf_counter() - t0
        if self.hooks.reseeded is not None:  # a worker_init_fn's seeds, seen by the scheduler
            # (its "ready" comes before the worker's samples): warned of at the user's next()
            self.hooks.warn_reseeded(self.loader is not None and self.loader.generator is not None)
        kind, value, positions = item
        if kind in ("batch", "future", "deferred"):
            try:
                return self._batch(item, block, c0, deadline)
            finally:  # an error's traceback holds this frame: not the future (or the batch)
                item = value = None
        if not block:
            return None  # the end, or an error, comes after the batches taken ahead (held)
        if kind == "raise":  # one sample's (or batch's) error: raised, and the epoch goes on
            self.meter.consumer_cpu_s += time.thread_time() - c0
            if self.feed is not None and self.feed.per_batch:  # raised in its batch's place:
                self._raised_batches += 1  # torch reads the next batch then, as on delivery
                self._top_up(wake=True)
            self.scheduler.let_go()  # the training thread holds the error's last reference
            self._held = None  # last: no call between it and the raise below
        elif kind == "end":  # (held: interrupted before the close, the next take ends it)
            lost = self.scheduler.counters.batches_out - self.batches_taken
            if lost > 0:  # unfinished: state_dict() still describes the epoch
                self._end_with(RuntimeError(
                    f"{lost} batch(es) of this epoch left the loader's queue and never reached "
                    "the training loop (an interrupt such as Ctrl-C inside next()): the epoch "
                    "is not finished; state_dict() resumes the samples not delivered"))
            self.meter.t_end = time.perf_counter()
            self.close()
            raise StopIteration
        else:  # an error that ends the epoch (the sampler's): unfinished, so state_dict()
            item = None  # still describes it and a resume delivers the rest
            try:
                self._end_with(value)
            finally:  # this frame is in the error's traceback: it must not hold the error
                value = None
        try:
            raise value
        finally:  # this frame is in the error's traceback: it must not hold the error itself
            value = item = None

    def _batch(self, item: tuple[str, Any, Any], block: bool, c0: float,
               deadline: float | None = None) -> tuple[Any, Any] | None:
        """The batch of a queue ``item`` (``"batch"``, or a user ``collate_fn``'s
        ``"future"`` or ``"deferred"`` one, collated now) and its positions; ``None`` when a
        non-blocking take finds its collation still running (held for later). The item stays
        held (``_held``) until the batch is returned, so a take interrupted meanwhile (a Ctrl-C
        while it waits for the collation or runs it) leaves it to the next take: dropped, its
        batch was lost for the rest of the epoch. Held collated, once it is. ``deadline``: of
        the loader's ``timeout``, when this take waited for the queue already (``take``)."""
        kind, value, positions = item
        try:
            if kind != "batch":  # a user collate_fn's batch (runtime/output.py)
                if kind == "future" and not block and not value.done():
                    return None  # (held)
                value = self._collated(kind, value, positions, deadline)
                self._held = item = ("batch", value, positions)
            n = len(positions)
            self.meter.consumer_cpu_s += time.thread_time() - c0
            self._held = None  # these three last: nothing can interrupt what follows
            self.batches_taken += 1
            self.scheduler.consumed += n  # (the scheduler is woken at ``mark``)
            return value, positions
        except BaseException:
            if self._held is None:  # the batch's own error, settled (``_collated``): the
                del value, item  # traceback holds this frame, a cycle through the future
            raise  # else an interrupt: the batch stays held, for the next take

    def _collated(self, kind: str, collate: Any, positions: Any,
                  deadline: float | None = None) -> Any:
        """What a user ``collate_fn`` made of a batch: the ``"future"``'s result, or the
        ``"deferred"`` collation run here. Its ``StepError`` (the batch raises in place, as in
        torch) takes the batch's samples out of flight; so does whatever else a collate
        thread's call raised (``SystemExit``, ``KeyboardInterrupt``, a user's own
        ``BaseException``: raised as itself, as torch's ``num_workers=0`` does, with a note
        naming the step and the batch), since no signal lands on that thread: it is the
        ``collate_fn``'s own doing. Taken for an interrupt, the batch was dropped uncounted
        and the epoch ended with an error blaming a Ctrl-C for a lost batch. Any other
        exception here is an interrupt of this thread (while it waited, or ran the
        collation): the batch stays held for the next take, where a ``"deferred"`` one runs
        again, however often a ``KeyboardInterrupt`` cuts it short; one whose re-run raises
        another exception that is not an ``Exception`` again (``SystemExit``, a user's own
        ``BaseException``) raises as a collate thread's does, taking the batch with it, the
        rule ``num_workers=0`` applies to a sample (``runtime/inprocess.py``): such a
        ``collate_fn`` in one of the first batches made every later ``next()`` raise it.

        The loader's ``timeout`` bounds the wait for a collate thread's result, as torch's
        bounds its wait for a worker that collates (what is left of it when ``deadline``, set
        by ``take``'s wait for the queue, is given): it raises torch's ``RuntimeError`` and the
        batch stays held, for the next ``next()`` to wait for again. A ``"deferred"``
        collation runs in this thread: nothing bounds it (README)."""
        t0 = time.perf_counter()
        try:
            if kind == "future":
                return self._result(collate, deadline)
            batch = collate()
            self._cuts.ran()
            return batch
        except StepError:
            self._settle_raised(positions)
            collate = None  # held by the error's traceback: a cycle through the future
            raise
        except BaseException as e:
            if kind == "future":
                if collate.done() and not collate.cancelled() and collate.exception() is e:
                    self._settle_raised(positions)  # the call's own outcome
            elif self._cuts.fails(collate, e):  # its re-run raised too: the collate_fn's own
                self._settle_raised(positions)
            collate = None  # (as above)
            raise
        finally:
            self.meter.stall_s += time.perf_counter() - t0

    def _result(self, future: Any, deadline: float | None) -> Any:
        """A collate thread's result, waited for at most until ``deadline`` (else the whole
        ``timeout``; unbounded without one)."""
        if self.timeout_s <= 0:
            return future.result()
        if deadline is None:
            deadline = time.monotonic() + self.timeout_s
        try:
            return future.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError as e:
            if future.done() and not future.cancelled():  # the collate_fn's own TimeoutError,
                if future.exception() is e:  # or it finished as the wait ran out (raised as a
                    raise  # bare TimeoutError then); a call the loader's close cancelled: the
                return future.result()  # timeout (exception() raised CancelledError there)
        raise RuntimeError(f"DataLoader timed out after {self.timeout_s} seconds waiting for a "
                           "batch (its collate_fn had not returned)")

    def _settle_raised(self, positions: Any) -> None:
        """The batch at ``positions`` raised instead of being delivered: out of flight, and
        its room for the sampler's next samples."""
        self._held = None  # first: an interrupt in what follows must not re-run it
        self._cuts.ran()
        self.batches_taken += 1
        self.scheduler.consumed += len(positions)  # its samples leave with its error
        self._raised += len(positions) or 1  # (an empty batch counts as one)
        self._raised_batches += 1
        self._top_up(wake=True)

    def _get_blocking(self, deadline: float | None) -> tuple[str, Any, Any]:
        """The next item of the queue; ``deadline``: ``time.monotonic()`` at which the loader's
        ``timeout`` raises (None: never)."""
        while True:
            wait = GET_POLL_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:  # the epoch goes on: the next next() waits again, as in torch
                    raise RuntimeError(
                        f"DataLoader timed out after {self.timeout_s} seconds waiting for a batch"
                    )
            try:
                return self._out.get(timeout=wait)
            except queue.Empty:
                pass  # checked outside the handler: a Ctrl-C there printed the Empty as its cause
            if not self.scheduler._thread.is_alive() and self._out.empty():
                if self._closed:  # loader.close() from another thread while this one waited:
                    self._check_open()  # what next() raises after close() (LoaderClosedError)
                self.broken("headrace scheduler thread stopped unexpectedly")
                self.close()
                raise RuntimeError("headrace scheduler thread stopped unexpectedly")
            # a wake-up lost to an interrupt inside queue.Queue.get (after it left the queue):
            # nothing came for GET_POLL_S, so do what it asked (the scheduler waited for it)
            if self.feed is not None and self.feed.asked:
                self._top_up()
            asked = self.pool.requests
            if asked and asked.due(idle=True):
                self.pool.start_requested(on_added=self.scheduler.wake)

    def stats(self) -> EpochStats:
        c = self.scheduler.counters
        return self.meter.snapshot(c.fast, c.slow, c.skipped, c.retried, c.scheduler_cpu_s, c.moved,
                                   c.failed, c.shared_samples, c.dropped)

    def _release(self) -> None:
        """Stop the scheduler; stop the workers unless they persist; drop what it queued and
        nobody will take (batches, an error whose traceback holds the scheduler's frames)."""
        self.scheduler.stop()
        self.hooks.read_order_watch(self.pool)
        self._held = None
        self._cuts.ran()
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
