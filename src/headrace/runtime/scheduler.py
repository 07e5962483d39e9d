"""The sample-level scheduler: one thread in the training process per epoch.

It owns the epoch's work: pulls sampler positions, sends samples (not batches) to workers,
receives finished samples, hands slow ones to the slow lane, copies each finished sample straight
into its row of its batch (``runtime/assembly.py``), and puts finished batches on the queue the
training loop reads. MinatoLoader Algorithm 1, done with processes:

* which worker gets which sample next (the fast lane, the slow lane's share of the workers,
  taking over samples queued behind slow ones): ``runtime/dispatch.py``;
* slow lane: a sample over the learned timeout comes back with its partial value and the index
  of its next step; it waits in the slow backlog and is resumed at that step by a worker;
* batcher: the next samples to finish form the next batch, whichever lane they came through
  (``runtime/batcher.py``).

Its parts: the queues of work not yet on a worker (``runtime/lanes.py``), dispatch
(``runtime/dispatch.py``), batches going out (``runtime/output.py``), what its thread waits on
(``runtime/waiter.py``), workers that die or hang (``runtime/deaths.py``), workers still
starting (``runtime/starts.py``); here: its thread, results.

Worker threads (``runtime/threadworker.py``) hand their results in through ``deliver``, in
their own thread; that is why the scheduler's state changes under ``_lock``.

Exactly-once: every task has a tid; a result is accepted only for a tid still outstanding, a
position is completed once, and the training loop marks positions delivered one batch at a time.
Shutdown: see NOTE [headrace shutdown] in ``runtime/worker_stop.py``.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import weakref
from typing import Any

from headrace.errors import (
    TRANSPORT_STEP,
    StepError,
    WorkerDiedError,
    step_error_for,
    worker_start_error,
)
from headrace.runtime import live_pools
from headrace.runtime.deaths import Deaths
from headrace.runtime.dispatch import Dispatcher
from headrace.runtime.handles import WorkerHandle
from headrace.runtime.lanes import Lanes
from headrace.runtime.output import BatchOutput
from headrace.runtime.pool import WorkerPool
from headrace.runtime.ring import decode as ring_decode
from headrace.runtime.starts import Starts
from headrace.runtime.transport import decode, encode
from headrace.runtime.waiter import POLL_S, Waiter, next_poll_s
from headrace.runtime.work import Counters, EpochSpec, Fatal, Rec

log = logging.getLogger("headrace")


class Scheduler:
    """Runs one epoch in a background thread; the training loop reads ``out``."""

    def __init__(
        self,
        pool: WorkerPool,
        spec: EpochSpec,
        hooks: Any,
        out: queue.Queue[tuple[str, Any, Any]],
    ) -> None:
        self.pool = pool
        self.spec = spec
        self.hooks = hooks  # runtime.monitor.Monitor: on_sample, on_tick, on_skip, ...
        self.out = out
        self.counters = Counters()
        self.consumed = 0  # written by the training loop only: samples yielded (or dropped with
        # their batch by a failing collate_fn)
        self.lanes = Lanes(spec, pool.tids)  # work not yet on a worker; samples in flight
        self._recs = self.lanes.recs
        self.output = BatchOutput(spec, out, self.counters, hooks)
        # a weak reference: a closure over ``self`` would make a cycle, and the epoch's
        # memory (its batch buffers among it) would wait for the garbage collector
        me = weakref.proxy(self)
        self.dispatcher = Dispatcher(pool, spec, self.lanes, self.counters, hooks,
                                     lambda: me.in_flight)
        self.deaths = Deaths(pool, spec, self.lanes, self.counters, hooks,
                             lambda rec, err: me._fail(rec, err))  # no cycle: see above
        self.starts = Starts(pool, lambda w, msg: me._handle(w, msg))
        self.starts.forget_failed()  # persistent workers: before the epoch (re)starts any
        self._stop = threading.Event()
        self.readiness = threading.Condition()
        """Notified each time a worker says it is ready (a caller waits on it for workers
        to start, Ray actors' placement taking seconds, instead of polling)."""
        self._waiter = Waiter()
        self._poll_s = POLL_S  # how long the next wait blocks at most (seconds): IDLE_POLL_S
        self._thread = threading.Thread(target=self._run, name="headrace-scheduler", daemon=True)
        # Worker threads hand results in directly (``deliver``): the state below is shared with
        # them, so every change to it happens under this lock.
        self._lock = threading.RLock()
        self._finished = False  # "end" or "error" is on ``out``: nothing more to do
        self._deliver_cpu_s = 0.0  # CPU seconds worker threads spent in deliver()
        self._sinks: dict[int, Any] = {}  # slot -> the sink this scheduler gave that thread

    # -- control -------------------------------------------------------------------------------
    def start(self) -> None:
        live_pools.running(self)  # stopped at exit
        self._thread.start()

    def wake(self, leaving: bool = False) -> None:
        """Wake the scheduler thread (a byte on its wake-up pipe): work to dispatch.
        ``leaving``: the training thread, on its way out of ``next()`` (``Waiter.wake``)."""
        self._waiter.wake(leaving)

    def left(self) -> None:
        """The training thread is out of ``next()``: the woken thread need not give way."""
        self._waiter.left()

    @property
    def _wake_r(self) -> int:
        return self._waiter.wake_fd

    def room_freed(self, leaving: bool = False) -> None:
        """Called by the training loop after taking a batch: room for more work. ``leaving``:
        on its way out of ``next()`` (from ``mark``), not about to wait for a batch.

        With worker threads the training thread dispatches that work itself when the
        scheduler's lock is free. Waking the scheduler thread instead (a pipe write) releases
        the GIL, the woken thread takes it, and the training loop waits for it to give it
        back: on imseg that wait was 53-76 ms of a 1.8 s epoch, inside ``next()`` with the
        batch already there. Taking a free lock never releases the GIL, and the worker threads
        that get work take the GIL only when the training loop lets go of it. With worker
        processes (sending their tasks is a pipe write too), or when another thread holds the
        lock (a worker thread in ``deliver``, or the scheduler thread), the scheduler thread is
        woken, and its next pass sees the room; it first lets the training thread leave
        ``next()`` (``runtime/waiter.py``), which calls :meth:`left`. An error in the dispatch
        (the sampler, a ``collate_fn``) ends the epoch as it would in the scheduler thread: the
        training loop gets it after the batches already queued.
        """
        if self.pool.executor == "threads" and self._lock.acquire(blocking=False):
            try:
                if not self._done:
                    self._advance()
            except Exception as e:  # noqa: BLE001 - Fatal or a scheduler bug, as in _run;
                self._finish_with(e)  # a KeyboardInterrupt goes straight to the user
            finally:
                self._lock.release()
            return
        self.wake(leaving)

    def let_go(self) -> None:
        """Return once the thread that queued a sample's error (this scheduler's, or a worker
        thread in ``deliver``) has left the handling it queued it in: every error is made and
        queued under ``_lock``, by calls that return before it is released, so afterwards
        none of that thread's frames holds the error. The training thread calls this before
        raising one: the error's traceback holds the epoch iterator's frames, and when the
        scheduler's thread held the last reference to it (``on_death``'s local, ``emit``'s
        while it collated the next batch) the iterator was finalised there, its workers
        joined in that thread while the training loop, out of its ``except`` block, already
        took them for stopped (NOTE [headrace shutdown] in ``runtime/worker_stop.py``)."""
        with self._lock:
            pass

    def stop(self) -> None:
        """Stop the thread (idempotent); the pool is the caller's to stop or keep."""
        self._stop.set()
        with self._lock:
            pass  # a worker thread's deliver() under way has finished; later ones refuse
        self.wake()
        # Not from inside deliver() (e.g. the garbage collector finalising the epoch in a worker
        # thread): the scheduler thread may be waiting for the lock that thread holds.
        inside = self._lock._is_owned()  # type: ignore[attr-defined]
        if self._thread.is_alive() and threading.current_thread() is not self._thread \
                and not inside:
            self._thread.join(5.0)
        self._detach_threads()
        self._waiter.close()
        self.output.close()

    @property
    def _done(self) -> bool:
        """No more work for this epoch: it ended, or it or the pool was stopped."""
        return self._finished or self._stop.is_set() or self.pool.closed

    @property
    def in_flight(self) -> int:
        """Samples pulled from the sampler and not yet yielded (or skipped, failed, discarded)."""
        c = self.counters
        return self.lanes.pulled - self.consumed - c.skipped - c.failed - c.discarded

    @property
    def slow_backlog(self) -> int:
        return len(self.lanes.backlog)

    # -- thread body ---------------------------------------------------------------------------
    def _run(self) -> None:
        cpu0 = time.thread_time()
        try:
            while not self._stop.is_set() and not self.pool.closed:
                with self._lock:
                    if self._finished:
                        return
                    self.counters.scheduler_cpu_s = time.thread_time() - cpu0 + self._deliver_cpu_s
                    if self._advance():
                        return
                    self.hooks.on_tick(self)
                    if self.spec.sample_timeout_s is not None:
                        self.deaths.kill_hung()
                self._wait_and_handle()
        except BaseException as e:  # noqa: BLE001 - Fatal, or a scheduler bug: to the user
            with self._lock:
                self._finish_with(e)
        finally:
            self._detach_threads()
            self.counters.scheduler_cpu_s = time.thread_time() - cpu0 + self._deliver_cpu_s

    def deliver(self, w: WorkerHandle, msg: tuple[Any, ...]) -> bool:
        """A worker thread's message, handled in that thread (no hand-over to this scheduler's
        thread: a pipe write, a wake-up and a GIL hand-over per sample). False when this epoch
        is over: the message then waits in the thread's result queue for the next one."""
        with self._lock:
            if self._done:
                return False
            cpu0 = time.thread_time()
            try:
                self._handle(w, msg)
                self._advance()
            except BaseException as e:  # noqa: BLE001 - as in _run
                self._finish_with(e)
            self._deliver_cpu_s += time.thread_time() - cpu0
            return True

    def _advance(self) -> bool:
        """Dispatch work and emit ready batches; True (and "end" put, or the error the sampler
        raised once what it gave before is delivered) when the epoch is done."""
        self.dispatcher.dispatch()
        if self.starts.hold():  # a worker_init_fn's error comes before any batch
            return False
        if self.output.emit(self.lanes.complete):
            self.starts.read()
            err, self.lanes.error = self.lanes.error, None  # held by the queue alone: a cycle
            self.out.put(("end", None, None) if err is None else ("error", err, None))
            self._finished = True
        return self._finished

    def _finish_with(self, e: BaseException) -> None:
        if not self._finished:
            self._finished = True
            self.out.put(("error", e.error if isinstance(e, Fatal) else e, None))

    def _detach_threads(self) -> None:
        """Worker threads stop handing results to this scheduler (persistent workers keep
        theirs in their queue for the next epoch's, unless it attached itself already)."""
        for w in list(self.pool.workers.values()):
            if w.is_thread and w.conn.sink is self._sinks.get(w.slot):
                w.conn.sink = None
        self._sinks.clear()  # they hold ``self.deliver``: a cycle that would keep this epoch's
        # memory (its batch buffers among it) until the garbage collector runs

    def _wait_and_handle(self) -> None:
        """Wait for results, deaths or a wake-up (``runtime/waiter.py``), then handle them."""
        if self._waiter.closed:
            return
        for w in self._waiter.sync(dict(self.pool.workers)):  # a C-level copy: may be growing
            if w.is_thread:  # from now on it hands its results in itself
                w.conn.sink = self._sinks[w.slot] = functools.partial(self.deliver, w)
        dead: list[WorkerHandle] = []
        workers = list(self.pool.workers.values())
        t0 = time.monotonic()
        events = self._waiter.wait(workers, self._poll_s)
        idle = (not events and time.monotonic() - t0 >= self._poll_s
                and not any(w.assigned for w in workers))  # a wake-up returns early
        self._poll_s = next_poll_s(self._poll_s, idle)
        for what, w in events:
            if what == "conn":
                try:  # one message per readiness: the selector is level-triggered
                    msg = w.conn.recv()
                except (EOFError, OSError):
                    dead.append(w)
                else:
                    with self._lock:  # once a worker thread ended the epoch, only "ready" counts
                        if msg[0] == "many":
                            self.counters.shared_samples += len(msg[1])
                        self._handle_all(w, msg[1] if msg[0] == "many" else (msg,))
            elif not w.process.is_alive():
                dead.append(w)
        with self._lock:
            if self._finished or self._stop.is_set() or self.pool.closed:
                return  # a death after the end is the next epoch's to handle; workers that a
                # closing pool stopped (close(), interpreter exit) did not die: nothing re-runs
            for w in dict.fromkeys(dead):
                self._waiter.unwatch(w)
                self.deaths.on_death(w)

    # -- results -------------------------------------------------------------------------------
    def _handle_all(self, w: WorkerHandle, msgs: Any) -> None:
        """Handle ``msgs`` from ``w`` in order. Once the epoch is finished only ``"ready"``
        counts: the others are dropped, and their ring space freed, as on an error here
        (persistent workers write on into their rings; dropped, it stayed held until the
        worker's next message was read)."""
        dropped = []
        try:
            for m in msgs:
                if not self._finished or m[0] == "ready":
                    self._handle(w, m)
                else:
                    dropped.append(m)
        except BaseException:
            _free_ring(w, msgs)  # persistent workers write on after this error
            raise
        _free_ring(w, dropped)

    def _handle(self, w: WorkerHandle, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ready":
            w.ready = True
            self.deaths.ready(w.slot)
            with self.readiness:
                self.readiness.notify_all()
            if len(msg) > 2 and msg[2]:
                self.hooks.on_worker_reseeded(msg[2])
            return
        if kind == "init_error":
            _, slot, cause, text, tb, original = msg
            self.starts.failed(w, worker_start_error(  # raises Fatal, now or before a batch
                original, f"worker {slot} failed to start (worker_init_fn or dataset setup): "
                          f"{cause}: {text}\n\nOriginal traceback:\n{tb}"))
            return
        tid = msg[1]
        task = w.assigned.pop(tid, None)
        rec = self._recs.get(tid)
        ring = w.ring  # None: a worker thread, whose payload is the value itself
        if task is None or rec is None:
            _free_ring(w, (msg,))  # its ring space, all the same
            return  # a stale result of a task already re-run elsewhere
        if w.took is not None:
            w.took(tid)  # a backend's count (remote/): results taken, never stale ones
        if kind == "done":
            _, _, payload, timings, bytes_in, ring_end = msg
            if ring is None:
                self.output.place(rec, payload, None)
            else:
                self.output.place(rec, payload, ring)  # decoded where it is copied
                self.counters.sent_bytes = (ring_end - ring.read_pos.value  # (read in order)
                                            + ring.beside.value)  # (its worker's latest)
                ring.read_pos.value = ring_end
            del self._recs[tid]
            rec.step_s += sum(t.wall for t in timings)
            self.lanes.settled += 1
            if rec.slow:
                self.counters.slow += 1
            else:
                self.counters.fast += 1
            self.hooks.on_sample(rec.index, rec.step_s, rec.slow, timings, bytes_in)
        elif kind == "partial":
            _, _, next_step, payload, timings, bytes_in, drew_at, ring_end = msg
            c0 = time.thread_time()
            if ring is not None:
                # copied out of the worker's ring; large arrays go to the next worker by shared memory
                payload = encode(ring_decode(payload, ring, decode))
                ring.read_pos.value = ring_end
            if next_step == 0 and not timings:
                # handed back with nothing run (a Ray proxy that would not ship its load,
                # remote/proxy_options.py): not a move, not slow, and no part of a profile
                rec.task = rec.task._replace(payload=payload)
                self.lanes.backlog.append(rec)
                return
            self.counters.forward_cpu_s += time.thread_time() - c0
            self.counters.forwarded += 1
            rec.step_s += sum(t.wall for t in timings)
            rec.slow = True
            self.hooks.on_sample_partial(rec.index, timings, bytes_in)
            rec.task = rec.task._replace(start=next_step, payload=payload, may_hand_off=False,
                                         drew_at=drew_at)  # its cache stores no form after it
            self.lanes.backlog.append(rec)
        elif kind == "error":
            _, _, step, exc_cls, cause, text, tb, attributes = msg[:8]
            _free_ring(w, (msg,))  # a message that did not pickle: its ring end (outbox.py)
            names = self.pool.pipeline.step_names
            step_name = names[step] if 0 <= step < len(names) else TRANSPORT_STEP
            err = step_error_for(exc_cls, rec.index, step_name, cause, text, tb, w.slot,
                                 attributes=attributes)
            self._fail(rec, err)

    def _fail(self, rec: Rec, err: StepError | WorkerDiedError) -> None:
        """A sample failed: it is settled, and raised or skipped (``BatchOutput.fail``)."""
        self._recs.pop(rec.task.tid, None)
        self.lanes.settled += 1
        self.output.fail(rec, err)


def _free_ring(w: WorkerHandle, msgs: Any) -> None:
    """Free the ring space of the samples in ``msgs`` whose data is not read: finished or
    handed-off ones that an error left unhandled or that are stale, and those whose message
    did not pickle (an ``"error"`` carrying the ring end of the message it replaces, its
    ninth field, ``outbox.unsendable``)."""
    ends = [m[-1] for m in msgs if m[0] in ("done", "partial")
            or m[0] == "error" and len(m) > 8 and m[8] is not None]
    if w.ring is not None and ends and max(ends) > w.ring.read_pos.value:
        w.ring.read_pos.value = max(ends)
