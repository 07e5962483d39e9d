"""Finished samples into their batches; batches and errors onto the training loop's queue.

Used by the scheduler thread (``runtime/scheduler.py``), under its lock. The batcher
(``runtime/batcher.py``) decides a sample's batch and row when it arrives; the sample is copied
straight into that row (``runtime/assembly.py``). What the training loop reads from ``out``:
``("batch", batch, positions)``; ``("future", future, positions)`` for a batch a user
``collate_fn`` is collating on the collate threads (its result is the batch, its exception the
batch's error); ``("deferred", collate, positions)`` for one the training loop's thread
collates in ``next()`` (``collate()`` is the batch: ``runtime/collate_rng.py``);
``("raise", error, None)`` for a failed sample or batch (the epoch goes on, as in torch);
``("end" | "error", ...)`` from the scheduler itself; and the wake-ups ``("feed" | "start",
None, None)`` (``WAKE_UPS``), which ask the training thread to read the sampler or to fork a
worker and are not batches (``batches_queued``).

A user ``collate_fn`` runs on collate threads of the training process (daemons:
``runtime/daemon_pool.py``), not in the scheduler thread: one expensive ``collate_fn`` run batch after batch in the scheduler (under its lock, so
nothing is dispatched meanwhile) made it the pipeline's bottleneck. One thread by default, so
calls never overlap (torch calls it once at a time in each worker process; a collator reusing a
buffer or a tokenizer returned wrong batches on several); ``Options(collate_threads=N)`` runs
N, which helps a thread-safe ``collate_fn`` that spends its time outside the GIL (torch and
NumPy kernels, I/O); a pure-Python one still waits for the GIL (docs/design.md).
"""

from __future__ import annotations

import functools
import queue
from collections.abc import Callable
from typing import Any

from headrace.errors import StepError, WorkerDiedError
from headrace.planner.workers import available_cpus
from headrace.runtime.assembly import BatchAssembly
from headrace.runtime.collate_rng import collated_in_loop, one_at_a_time
from headrace.runtime.daemon_pool import DaemonPool
from headrace.runtime.ring import Ring
from headrace.runtime.work import Counters, EpochSpec, Fatal, Rec, collate_error, note_collate

WAKE_UPS = ("feed", "start")
"""Kinds of the training loop's queue items that wake its thread for work of its own (read the
sampler, fork a worker: ``runtime/epoch.py``) and carry no batch."""


def batches_queued(out: queue.Queue[tuple[str, Any, Any]]) -> int:
    """Items on the training loop's queue that are batches (or a batch's error or the end),
    not wake-ups: its occupancy. A wake-up waits there while the training step runs, and
    counted as a batch it made the queue look fuller than it was to the worker scaler."""
    with out.mutex:
        return sum(1 for item in out.queue if item[0] not in WAKE_UPS)


class BatchOutput:
    def __init__(self, spec: EpochSpec, out: queue.Queue[tuple[str, Any, Any]],
                 counters: Counters, hooks: Any) -> None:
        self.spec = spec
        self.out = out
        self.counters = counters
        self.hooks = hooks  # on_skip(index, error)
        self._batches: dict[int, BatchAssembly] = {}  # batch key -> batch being filled
        self._raise_for: dict[int, BaseException] = {}  # sampler batch key -> its sample's error
        self._collators: DaemonPool | None = None  # for a user collate_fn, made on use

    def place(self, rec: Rec, value: Any, ring: Ring | None) -> None:
        """Copy a finished sample into its row of its batch (out of ``ring`` before it is freed)."""
        key, row, capacity = self.spec.batcher.place(rec.position)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = BatchAssembly(
                capacity, self.spec.collate, self.spec.auto_collation, self.spec.buffers)
        try:
            batch.put(row, rec.index, value, ring)
        except Exception as e:  # noqa: BLE001 - a sample no batch can hold
            raise Fatal(collate_error(e, [rec.index])) from e

    def fail(self, rec: Rec, err: StepError | WorkerDiedError) -> None:
        """A sample failed. ``on_error="raise"``: as in torch, the training loop gets the error
        in place of the sample's batch (at once when batches are regrouped, in the sampler
        batch's turn otherwise) and the epoch goes on; ``"skip"``: dropped and counted."""
        key = self.spec.batcher.drop(rec.position)
        if self.spec.on_error == "raise":
            self.counters.failed += 1
            if key is None:
                self.out.put(("raise", err, None))
            else:
                self._raise_for.setdefault(key, err)
            return
        self.counters.skipped += 1
        self.hooks.on_skip(rec.index, err)

    def emit(self, final: bool) -> bool:
        """Put every ready batch on the output queue; ``final``: no sample is left to finish.
        True when the epoch's last batch went out."""
        while True:
            ready = self.spec.batcher.pop(final)
            if ready is None:
                break
            if ready.empty:  # a user batch_sampler's []: torch gives collate_fn([]) its turn
                self._put(functools.partial(_collate_empty, self.spec.collate, self.spec.pin),
                          [], True, ready.key)
                continue
            assembly = self._batches.pop(ready.key, None)
            err = self._raise_for.pop(ready.key, None)
            if assembly is None or err is not None or ready.drop:  # failed, skipped or dropped
                self.counters.discarded += len(ready.rows)
                if ready.drop:
                    self.counters.dropped += len(ready.rows)
                if err is not None:
                    self.out.put(("raise", err, None))
                else:
                    self.counters.batches_gone += 1
                continue
            collate = functools.partial(_collate, assembly, ready.rows, self.spec.pin)
            self._put(collate, ready.positions, not assembly.in_place, ready.key)
        return final and self.spec.batcher.ready_samples == 0

    def _put(self, collate: Callable[[], Any], positions: list[int], user: bool,
             key: int) -> None:
        """Queue the batch ``collate()`` makes: for a user ``collate_fn`` (``user``), in the
        training loop's thread, seeded for batch ``key``, while it is watched or where it
        draws random numbers (``runtime/collate_rng.py``), else on the collate threads;
        torch's made here. Its ``StepError`` goes out in its place."""
        place = self.spec.collate_place
        if user and place is not None and place.mode != "threads":
            s = self.spec
            self.counters.batches_out += 1
            self.out.put(("deferred", functools.partial(
                collated_in_loop, collate, place, s.base_seed, s.epoch, key), positions))
            return
        if user:
            if self._collators is None:
                self._collators = DaemonPool(  # one: calls never overlap
                    min(self.spec.collate_threads, available_cpus()), "headrace-collate")
            if place is not None and self.spec.collate_threads == 1:  # nor with the loop's
                collate = functools.partial(one_at_a_time, place, collate)
            self.counters.batches_out += 1
            self.out.put(("future", self._collators.submit(collate), positions))
            return
        try:
            batch = collate()
        except StepError as e:
            self.counters.discarded += len(positions)
            self.out.put(("raise", e, None))
            return
        self.counters.batches_out += 1
        self.out.put(("batch", batch, positions))

    def close(self) -> None:
        """Stop the collate threads (batches not yet collated are never delivered; a call
        running finishes in the background, and the process may exit before it does)."""
        if self._collators is not None:
            self._collators.shutdown()


def _collate(assembly: BatchAssembly, rows: list[int], pin: Callable[[Any], Any] | None) -> Any:
    """The batch of ``rows``; a failure is a ``StepError`` at step ``collate_fn`` naming the
    batch's sample indices."""
    return _pinned(lambda: assembly.finish(rows), pin, lambda: [assembly.indices[r] for r in rows],
                   lambda: assembly.samples(rows))


def _collate_empty(collate: Callable[[Any], Any], pin: Callable[[Any], Any] | None) -> Any:
    """``collate([])``, what torch makes of a batch sampler's empty batch (torch's
    ``default_collate`` raises ``IndexError`` there: a ``StepError`` at ``collate_fn``)."""
    return _pinned(lambda: collate([]), pin, list)


def _pinned(make: Callable[[], Any], pin: Callable[[Any], Any] | None,
            indices: Callable[[], list[int]],
            samples: Callable[[], list[Any]] = list) -> Any:
    """``make()``, pinned; its failure a ``StepError`` naming the batch's ``indices()`` (and
    which of its ``samples()`` differs from the others, if one does: read only then), or,
    for an exception that is not an error (``SystemExit``, a user's own ``BaseException``),
    that exception itself with a note naming them (``note_collate``)."""
    try:
        batch = make()
        return pin(batch) if pin is not None else batch
    except Exception as e:  # noqa: BLE001 - collate_fn is user code: that batch raises
        raise collate_error(e, indices(), samples) from e
    except BaseException as e:
        note_collate(e, indices())
        raise
