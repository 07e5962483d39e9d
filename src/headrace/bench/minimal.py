"""A reference loader for the benchmarks: the least work a loader that batches samples does.

Not a loader to use: it exists so that the benchmark can show, in the same run, how close to
the ideal pipeline any loader can get on this machine. The ideal charges nothing but the
steps; a real loader must at least run them somewhere and copy each finished sample into its
batch. This one does only that:

* ``num_workers`` threads of the training process take sampler positions in order and run the
  pipeline's steps on each (``SampleRunner``, no re-seeding of global generators), so a
  finished sample is handed over as the object itself: no process, no pipe, no copy;
* a finished sample joins the open batch (the next samples to finish form the next batch, as
  headrace's default delivery): its arrays are copied into their row of the batch's tensors
  right away (``runtime/assembly.py``: one copy per array, the same result as torch's
  ``default_collate``, in memory of batches already let go of, ``runtime/bufferpool.py``:
  fresh pages cost the kernel's zeroing); stacking a list of samples with ``default_collate`` instead was 3-5%
  slower on objdet, as ``torch.stack`` wakes the training process's intra-op threads); the
  thread that fills a batch queues it;
* at most ``prefetch_factor × num_workers × batch_size`` samples are taken and not yet
  yielded, the in-flight bound headrace's default uses.

There is no scheduler, slow lane, resume, worker scaling, error policy or worker process,
and the global generators are shared by the threads: what it measures is the price of
running the steps in this process and collating, nothing else. It is not a lower bound
either: its threads wait for the GIL where a step holds it, which processes would not.
"""

from __future__ import annotations

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
        if num_workers < 1 or batch_size < 1:
            raise ValueError("MinimalLoader needs num_workers >= 1 and batch_size >= 1")
        self.pipeline = pipeline
        self.order = list(order)
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.max_in_flight = prefetch_factor * num_workers * batch_size
        self._listeners: list[Listener] = []
        self.buffers = BufferPool()

    def add_sample_listener(self, fn: Listener) -> None:
        """Call ``fn(index, seconds, slow=False)`` for every finished sample (in its thread)."""
        self._listeners.append(fn)

    def __len__(self) -> int:
        return math.ceil(len(self.order) / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
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
        self.lock = threading.Lock()
        self.next_position = 0
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
            yield batch
            for _ in range(n):
                self.room.release()

    def stop(self) -> None:
        self.stopped.set()
        for _ in self.threads:  # wake threads waiting for room; they see ``stopped`` and exit
            self.room.release()
        for t in self.threads:
            t.join()

    def _work(self) -> None:
        order, size = self.loader.order, self.loader.batch_size
        while True:
            self.room.acquire()
            if self.stopped.is_set():
                return
            with self.lock:
                position = self.next_position
                self.next_position += 1
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
            try:
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
            except Exception as e:  # noqa: BLE001 - to the consumer
                self.out.put(e)
                self.stopped.set()
                return
            with self.lock:
                self.collating -= 1
                end = self.finished == len(order) and not self.collating and not self.ended
                self.ended = self.ended or end
            if end:  # every batch is queued (another thread may have been collating one)
                self.out.put(_END)
