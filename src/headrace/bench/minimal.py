"""A reference loader for the benchmarks: threads that run the steps and fill batches, nothing else.

Not a loader to use: it exists so that the benchmark shows, in the same run, how close to the
ideal pipeline a loader gets on this machine when all it does is run the steps in the training
process and copy each finished sample into its batch. The ideal charges nothing but the steps;
this charges the least a loader that hands over batches of arrays must add:

* ``num_workers`` threads of the training process take sampler positions in order and run the
  pipeline's steps on each (``SampleRunner``, no re-seeding of global generators; random steps
  get generators seeded from base seed 0 and epoch 0 on every epoch: one epoch is measured), so
  a finished sample is handed over as the object itself: no process, no pipe, no copy;
* a finished sample joins the open batch (the next samples to finish form the next batch, as
  in headrace's default delivery): its arrays are copied into their row of the batch's tensors
  right away (``runtime/assembly.py``: one copy per array, the same result as torch's
  ``default_collate``, in memory of batches already let go of: ``runtime/bufferpool.py``);
  the thread that fills a batch queues it;
* at most as many samples are taken and not yet handed to the consumer as headrace's default
  in-flight bound allows (``work.default_max_in_flight``).

There is no scheduler, slow lane, resume, worker scaling, error policy or worker process, and
the global generators are shared by the threads. It is not a lower bound: its threads wait for
the GIL where a step holds it, which processes would not, and those waits count in the
per-sample costs it reports, which raise its own ideal.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data._utils.collate import default_collate

from headrace.pipeline import Pipeline
from headrace.pipeline.runner import SampleRunner
from headrace.runtime.assembly import BatchAssembly
from headrace.runtime.bufferpool import BufferPool
from headrace.runtime.work import default_max_in_flight

Listener = Callable[[int, float, bool], None]
"""``listener(index, seconds, slow)``: a finished sample's load + step wall time (seconds)."""

_END = object()


class MinimalLoader:
    """Iterates batches of ``pipeline`` over ``order``; one epoch per ``iter``."""

    def __init__(
        self,
        pipeline: Pipeline,
        order: Sequence[int],
        batch_size: int,
        num_workers: int,
        prefetch_factor: int = 2,
    ) -> None:
        if num_workers < 1 or batch_size < 1 or prefetch_factor < 1:
            raise ValueError("MinimalLoader needs num_workers, batch_size and prefetch_factor >= 1")
        self.pipeline = pipeline
        self.order = list(order)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.max_in_flight = default_max_in_flight(batch_size, num_workers, prefetch_factor)
        """Samples taken and not yet handed to the consumer, at most (headrace's default)."""
        self._listeners: list[Listener] = []
        self.buffers = BufferPool()

    def add_sample_listener(self, fn: Listener) -> None:
        """Call ``fn(index, seconds, slow=False)`` for every finished sample (in its thread)."""
        self._listeners.append(fn)

    def __len__(self) -> int:
        return math.ceil(len(self.order) / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        if not self.order:
            return
        epoch = _Epoch(self)
        try:
            yield from epoch.batches()
        finally:
            epoch.stop()


class _Epoch:
    def __init__(self, loader: MinimalLoader) -> None:
        self.loader = loader
        self.runner = SampleRunner(loader.pipeline, reseed_globals=False)
        self.out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.room = threading.Semaphore(loader.max_in_flight)
        self.positions = itertools.count()
        self.take = threading.Lock()  # taking a position (never waits for a copy)
        self.lock = threading.Lock()  # the open batch and the counts below
        self.finished = 0
        self.open = self._new_batch()
        self.collating = 0  # batches taken out of ``open`` and not yet queued
        self.ended = False
        self.stopped = threading.Event()
        self.threads = [
            threading.Thread(target=self._work, name=f"headrace-minimal-{i}", daemon=True)
            for i in range(loader.num_workers)
        ]
        for t in self.threads:
            t.start()

    def _new_batch(self) -> BatchAssembly:
        return BatchAssembly(self.loader.batch_size, default_collate, True, self.loader.buffers)

    def batches(self) -> Iterator[Any]:
        while True:
            item = self.out.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            batch, n = item
            for _ in range(n):  # handed over: counted out of flight, as headrace counts it
                self.room.release()
            yield batch

    def stop(self) -> None:
        self.stopped.set()
        for _ in self.threads:  # wake threads waiting for room; they see ``stopped`` and exit
            self.room.release()
        for t in self.threads:
            t.join()

    def _work(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a listener, collation, a step's exit: to
            self.out.put(e)  # the consumer, which would otherwise wait for the end forever
            self.stopped.set()

    def _loop(self) -> None:
        order, size = self.loader.order, self.loader.batch_size
        while True:
            self.room.acquire()
            if self.stopped.is_set():
                return
            with self.take:
                position = next(self.positions)
            if position >= len(order):
                return
            index = order[position]
            out = self.runner.run(index, 0, None, 0, 0)
            if out.error is not None:
                step, exc, _ = out.error
                err = RuntimeError(f"sample {index}: step {self.runner.names[step]!r} failed: "
                                   f"{exc!r}")
                err.__cause__ = exc
                self.out.put(err)
                self.stopped.set()
                return
            seconds = math.fsum(t.wall for t in out.timings)
            for fn in self.loader._listeners:
                fn(index, seconds, False)
            full = None
            with self.lock:
                batch = self.open
                batch.put(len(batch.indices), index, out.value, None)
                self.finished += 1
                if len(batch.indices) == size or self.finished == len(order):
                    full, self.open = batch, self._new_batch()
                    self.collating += 1
            if full is None:
                continue
            rows = sorted(full.indices)
            self.out.put((full.finish(rows), len(rows)))
            with self.lock:
                self.collating -= 1
                end = self.finished == len(order) and not self.collating and not self.ended
                self.ended = self.ended or end
            if end:  # every batch is queued (another thread may have been collating one)
                self.out.put(_END)
