"""``num_workers=0``: samples loaded in the training process, in the sampler's order, as torch.

The global random generators of the training process are saved and restored around each sample,
so per-sample seeding does not disturb the training loop's own randomness.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from headrace.cache.client import run_cached
from headrace.errors import StepError, step_error_for
from headrace.pipeline import Pipeline
from headrace.pipeline.runner import SampleRunner
from headrace.pipeline.seeding import global_states, restore_globals
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.draws import Draws
from headrace.runtime.epoch_base import EpochBase
from headrace.runtime.work import collate_error
from headrace.telemetry.stats import EpochStats


class InProcessIterator(EpochBase):
    """One epoch with ``num_workers=0``: samples loaded in ``next()``, in the sampler's order."""

    def __init__(
        self,
        pipeline: Pipeline,
        epoch: int,
        base_seed: int,
        groups: Iterator[Any],
        auto_collation: bool,
        collate: Callable[[Any], Any],
        pin: Callable[[Any], Any] | None,
        delivered: Bitmap,
        on_error: str,
        hooks: Any,
        measure: Any = None,
        cache: Any = None,
        cache_row: int = 0,
        ods: Any = None,
        may_repeat: bool = True,
        regroup: int = 0,
    ) -> None:
        super().__init__(epoch, hooks, delivered)
        self.runner = SampleRunner(pipeline, measure=measure)
        self.epoch = epoch
        self.base_seed = base_seed
        self.groups = groups
        self.auto_collation = auto_collation
        self.collate = collate
        self.pin = pin
        self.on_error = on_error
        self.skipped = 0
        self.failed = 0
        self._position = 0
        self.cache = cache  # a cache.client.CacheClient, or None
        self.cache_row = cache_row
        self.ods = ods  # a cache.ods_epoch.OdsEpoch (Cache(ods=True)), or None
        self.draws = Draws(may_repeat)  # how many times each index came before, this epoch
        self.regroup = regroup  # batch size when batches are regrouped (runtime/batcher.py)
        self._carry: list[tuple[Any, int, Any]] = []
        self._pending: list[tuple[int, Any, int]] = []  # (position, index, draw) not yet run
        self._again: tuple[Any, Any] | None = None  # a batch whose next() was interrupted
        self._sampler_stopped: str | None = None  # why the sampler cannot be read on

    def take(self, block: bool = True) -> tuple[Any, Any] | None:
        if self._closed:
            self._check_open()
        if not block:
            return None  # samples load in the training thread: nothing is ever ready ahead
        if self._again is not None:
            again, self._again = self._again, None
            return again
        t0, c0 = time.perf_counter(), time.thread_time()
        got, self._carry = self._carry, []  # (sample, position, index) loaded, not yet batched
        target = self.regroup or 1
        if self._pending:  # a group's samples after one that raised or was interrupted
            pending, self._pending = self._pending, []
            self._run(pending, got)
        while len(got) < target:
            if self._sampler_stopped is not None:
                if got:  # what was loaded before goes out first
                    break
                self._end_with(RuntimeError(self._sampler_stopped))  # unfinished:
                # state_dict() resumes the rest
            try:
                group = next(self.groups)
                indices = list(group) if self.auto_collation else [group]
            except StopIteration:
                if got:  # the last, short batch (only skipped samples can make it short when
                    break  # drop_last trimmed the sampler: they do so uninterrupted too)
                self.meter.t_end = time.perf_counter()
                self.close()
                raise
            except BaseException as e:
                self._stop_reading(e, got)
                raise
            if not indices:  # a user batch_sampler's empty batch: collate_fn([]), as torch
                break
            try:
                positions = range(self._position, self._position + len(indices))
                self._position += len(indices)
                draws = self.draws.repeats(positions, indices)  # delivered ones too
                if self.ods is not None:
                    todo = self.ods.fill(positions, indices)
                else:
                    todo = [(p, i) for p, i in zip(positions, indices, strict=True)
                            if p not in self.delivered]
            except BaseException as e:  # a Ctrl-C: the group was read, and is not run
                self._stop_reading(e, got)
                raise
            self._run([(p, i, draws.get(p, 0)) for p, i in todo], got)
        if self.regroup:  # batches of batch_size, whatever holes a resume left in the groups
            got, self._carry = got[:self.regroup], got[self.regroup:]
        samples = [g[0] for g in got]
        done = [g[1] for g in got]
        indices = [g[2] for g in got]
        try:
            try:
                batch = self.collate(samples) if self.auto_collation else self.collate(samples[0])
            except Exception as e:
                raise collate_error(e, indices) from e
            if self.pin is not None:
                batch = self.pin(batch)
        except BaseException as e:
            if not isinstance(e, Exception):  # a Ctrl-C: the next take collates them again
                self._carry = got + self._carry
            raise
        m = self.meter
        m.stall_s += time.perf_counter() - t0  # every second in here is the loop waiting
        m.consumer_cpu_s += time.thread_time() - c0
        return batch, done

    def _run(self, items: list[tuple[int, Any, int]], got: list[tuple[Any, int, Any]]) -> None:
        """Load ``items`` ((position, index, draw) each) into ``got``. A sample that raises
        (``on_error="raise"``) raises here; when batches are regrouped, what was gathered and the
        items after it wait for the next batch, as the workers' regrouping keeps them (lost
        before: up to two batches' worth per failing sample). Interrupted (a Ctrl-C while a
        sample loads), what was gathered waits too, and the interrupted sample runs again (its
        seeds are its own): the rest of its batch was lost before."""
        for n, (p, i, d) in enumerate(items):
            try:
                ok, value = self._one(i, d)
            except StepError:
                if self.regroup:
                    self._carry, self._pending = got, items[n + 1:]
                raise
            except BaseException:
                self._carry, self._pending = got, items[n:]
                raise
            if ok:
                got.append((value, p, i))

    def _one(self, index: int, draw: int) -> tuple[bool, Any]:
        state = global_states()
        try:
            out = run_cached(self.cache, self.runner.run, index, 0, None, self.base_seed,
                             self.epoch, self.cache_row, draw=draw)
        finally:
            restore_globals(state)
        if out.error is None:
            self.hooks.on_sample(index, sum(t.wall for t in out.timings), False, out.timings)
            return True, out.value
        step, exc, tb = out.error
        err: StepError = step_error_for(
            type(exc), index, self.runner.names[step], type(exc).__qualname__, str(exc), tb,
            instance=exc,
        )
        if self.on_error == "raise":
            self.failed += 1
            raise err from exc  # for this batch only: the next next() goes on, as in torch
        self.skipped += 1
        self.hooks.on_skip(index, err)
        return False, None

    def _stop_reading(self, e: BaseException, got: list[tuple[Any, int, Any]]) -> None:
        """The sampler raised ``e``, or something interrupted a group's read (a Ctrl-C): the
        sampler cannot be read on from where it stopped (a generator that raised is done, and
        read on it ended the epoch early, finished for ``state_dict()`` too). What was loaded
        goes out in the next batch, then the epoch ends unfinished with an error saying so
        (``state_dict()`` resumes it), as with worker processes (``runtime/feed.py``)."""
        self._sampler_stopped = (
            f"the sampler raised or was interrupted while it was read ({type(e).__name__}): "
            "the rest of this epoch cannot be read from it; state_dict() resumes it")
        self._carry = got

    def give_back(self, batch: Any, positions: Any) -> None:
        self._again = (batch, positions)

    def stats(self) -> EpochStats:
        return self.meter.snapshot(self.meter.samples, 0, self.skipped, 0, 0.0, failed=self.failed)
