"""``num_workers=0``: samples loaded in the training process, in the sampler's order, as torch.

The global random generators of the training process are saved and restored around each sample,
so per-sample seeding does not disturb the training loop's own randomness.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from headrace.cache.running import run_cached
from headrace.errors import StepError, message_of, step_error_for
from headrace.pipeline import Pipeline
from headrace.pipeline.runner import SampleRunner
from headrace.pipeline.seeding import global_states, restore_globals
from headrace.runtime import python_draws
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.draws import Draws
from headrace.runtime.epoch_base import EpochBase
from headrace.runtime.order_watch import guard_for
from headrace.runtime.work import CutShort, collate_error, note_collate
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
        drop_last: bool = False,
    ) -> None:
        super().__init__(epoch, hooks, delivered)
        # told the steps earlier epochs saw drawing from Python's generator, and telling
        # the next epochs what it sees (runtime/python_draws.py)
        self.runner = SampleRunner(pipeline, measure=measure,
                                   python_draws=python_draws.known(pipeline),
                                   on_python_draw=functools.partial(python_draws.learn_step,
                                                                    pipeline),
                                   guard=guard_for(pipeline,
                                                   lambda _step, why: hooks.on_order_broke(why)))
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
        self.drop_last = drop_last  # regrouped: a last batch left short is dropped, as there
        self.dropped = 0  # samples of that batch (EpochStats.dropped_samples)
        self._carry: list[tuple[Any, int, Any]] = []  # (sample, position, index) loaded
        self._pending: deque[tuple[int, Any, int]] = deque()  # (position, index, draw) to run
        self._again: tuple[Any, Any] | None = None  # a batch whose next() was interrupted
        self._peeked: list[Any] = []  # a group read by read_end(), planned by the next next()
        self._stopped: BaseException | None = None  # why the sampler cannot be read on
        self._ended = False  # the sampler's end was read (its positions: ``_position``)
        self.discarded = 0  # loaded samples a failed batch took with it (as in torch)
        self._cuts = CutShort()  # a sample's run or a batch's collation cut short

    def take(self, block: bool = True) -> tuple[Any, Any] | None:
        """The next batch. What was loaded and not yet returned lives on ``self`` (``_carry``,
        ``_pending``) from the moment it is loaded: a take interrupted anywhere (a Ctrl-C while
        a sample loads, while the batch collates) leaves it to the next one, which goes on from
        there; held in locals, it was lost for the rest of the epoch."""
        if self._closed:
            self._check_open()
        if not block:
            return None  # samples load in the training thread: nothing is ever ready ahead
        if self._again is not None:
            again, self._again = self._again, None
            return again
        t0, c0 = time.perf_counter(), time.thread_time()
        target = self.regroup or 1
        empty = False  # a user batch_sampler's empty batch: collate_fn([]), as torch
        while True:
            if self._pending:  # a group's samples not run yet
                self._run(target if self.regroup else None)
            if self._carry and (not self.regroup or len(self._carry) >= target):
                break
            if self._stopped is not None:  # the sampler cannot be read on
                if self._carry:  # what was loaded before goes out first
                    break
                self._end_with(self._stopped)  # unfinished: state_dict() resumes the rest
            try:
                group = self._peeked.pop() if self._peeked else next(self.groups)
                if isinstance(group, _SamplerError):
                    raise group.error  # what read_end() met: handled as if read here
                indices = list(group) if self.auto_collation else [group]
            except StopIteration:
                if self.regroup and self.drop_last and 0 < len(self._carry) < target:
                    # skipped or failed samples left the last regrouped batch short: dropped
                    # and counted, as the workers' batcher does (it went out short here)
                    self.dropped += len(self._carry)
                    self._carry.clear()
                self._ended = True
                if self._carry:  # the last, short batch
                    break
                self.meter.t_end = time.perf_counter()
                self.close()
                raise
            except BaseException as e:
                self._stop_reading(e)
                if isinstance(e, Exception):  # the sampler's error, after what was loaded (as
                    if self._carry:  # with workers), once, then the epoch ends unfinished
                        break
                    self._end_with(e)
                raise
            if not indices:
                empty = True
                break
            self._plan(indices)
        return self._collate(empty, t0, c0)

    def read_end(self) -> bool:
        """Read the sampler once more, as the ``next()`` that ends the epoch would: True when
        it ended (the draws a sampler makes at its end are made: torch's ``RandomSampler``
        draws one more permutation there, which the next epoch's order follows), False when
        it gave more (kept for the next ``next()``). For ``state_dict()`` once every position
        is settled: only then is the state between epochs; and for ``loader.close()``, to
        tell an epoch at its end from one closed part-way (``span.halt_unfinished``); for an
        oversampler's ``state_dict()`` once its deliveries reach its length (``span.at_end``):
        the group read is kept for the next ``next()``, which takes it."""
        if self._ended:
            return True
        if self._peeked or self._stopped is not None:  # (stopped: its end is unknown)
            return False
        try:
            self._peeked.append(next(self.groups))
        except StopIteration:
            self._ended = True
            return True
        except Exception as e:  # noqa: BLE001 - the sampler's error: raised by the next next()
            self._peeked.append(_SamplerError(e))
        except BaseException as e:  # interrupted (a Ctrl-C), as in take(): the sampler cannot
            self._stop_reading(e)  # be read on, and the next next() says so (it ended the
            raise  # epoch with a StopIteration, its rest untold, its state between epochs)
        return False

    def known_length(self) -> int | None:
        return self._position if self._ended else None

    def ends_here(self) -> bool:
        """Whether the epoch is at its end, which only reading the sampler tells (done here,
        as the ``next()`` that ends the epoch would; more is kept for the next ``next()``):
        every position read is settled, none of its batches is waiting, and the sampler ends
        next. What ``loader.close()`` asks of a sampler that gave fewer positions than its
        ``__len__`` (the workers' feed has read its end by then): such an epoch closed after
        its last batch raised ``LoaderClosedError``, its missing positions counted as not
        delivered. Never before the first ``next()``: torch reads the sampler's first
        element there, after whatever the training loop draws from the global generators."""
        if not self._position or self._pending or self._carry or self._again is not None \
                or self._stopped is not None:
            return False
        return self.read_end()

    def _plan(self, indices: list[Any]) -> None:
        """Queue a group's samples to run (``_pending``); interrupted here, the group was read
        and is not queued: the epoch ends as for an interrupted sampler (a tiny window, no user
        code in it)."""
        try:
            positions = range(self._position, self._position + len(indices))
            self._position += len(indices)
            draws = self.draws.repeats(positions, indices)  # delivered ones too
            if self.ods is not None:
                todo = self.ods.fill(positions, indices)
            else:
                todo = [(p, i) for p, i in zip(positions, indices, strict=True)
                        if p not in self.delivered]
            items = [(p, i, draws.get(p, 0)) for p, i in todo]
            self._pending.extend(items)  # all at once: a list holds no code to interrupt
        except BaseException as e:
            self._stop_reading(e)
            raise

    def _collate(self, empty: bool, t0: float, c0: float) -> tuple[Any, Any]:
        """The batch of what was loaded (``batch_size`` of it when regrouped). Interrupted (a
        Ctrl-C while ``collate_fn`` runs), the samples stay loaded for the next take; a
        ``collate_fn`` error takes them with it, as in torch, and so does another exception
        that is not a ``KeyboardInterrupt`` when the re-run raises it again (the rule
        :meth:`_run` applies to a sample: such a ``collate_fn`` made every later ``next()``
        raise it); either names the step and the batch (a ``StepError``, or a note on an
        exception that is not an ``Exception``, raised as itself as torch does)."""
        carry = self._carry
        got = [] if empty else carry[:self.regroup] if self.regroup else list(carry)
        samples = [g[0] for g in got]
        indices = [g[2] for g in got]
        done = [g[1] for g in got]
        try:
            batch = self.collate(samples) if self.auto_collation else self.collate(samples[0])
            if self.pin is not None:
                batch = self.pin(batch)
        except Exception as e:
            self.discarded += len(got)
            del carry[:len(got)]
            raise collate_error(e, indices, samples) from e
        except BaseException as e:
            note_collate(e, indices)
            if got and self._cuts.fails(("batch", done), e):  # the collate_fn's own doing
                self.discarded += len(got)
                del carry[:len(got)]
            raise
        self._cuts.ran()
        m = self.meter
        m.stall_s += time.perf_counter() - t0  # every second in here is the loop waiting
        m.consumer_cpu_s += time.thread_time() - c0
        del carry[:len(got)]  # last, with no call after it: returned, or still loaded
        return batch, done

    def _run(self, limit: int | None) -> None:
        """Load pending samples into ``_carry`` (until it holds ``limit``; ``None``: all of
        them). A sample that raises (``on_error="raise"``) raises here; when batches are
        regrouped, what was loaded and the samples after it wait for the next batch, as the
        workers' regrouping keeps them (lost before: up to two batches' worth per failing
        sample); with the sampler's batches, its batch-mates go with it, as in torch.
        Interrupted (a Ctrl-C while a sample loads), nothing moved: the sample runs again at
        the next take (its seeds are its own), however often that happens; a sample whose run
        raises another exception that is not an ``Exception`` (``SystemExit``, a user's own
        ``BaseException``) twice in a row fails as one that raises an error does, with that
        exception: such user code made every later ``next()`` raise it again. A finished sample leaves
        ``_pending`` and joins ``_carry`` with no call between the two, where no interrupt
        can land."""
        pending, carry = self._pending, self._carry
        # the training loop's global generators, which the samples' steps re-seed, are put
        # back once the samples ran (restored per sample, the two took 80 of the 140 µs a
        # trivial sample cost here); the hooks, which reach user code (a sample listener, a
        # logging handler), are called after that, in order, as they were after each sample
        state = global_states()
        heard: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        raising = True  # (until the loop ends of itself: a hook's error may then be raised)
        try:
            while pending and (limit is None or len(carry) < limit):
                p, i, d = pending[0]
                try:
                    ok, value = self._one(i, d, heard)
                except StepError:
                    self._drop_first()
                    raise
                except BaseException as e:  # a Ctrl-C: the sample runs again, however often
                    if self._cuts.fails(("sample", p), e):  # its re-run raised too: its own
                        self.failed += 1  # doing
                        self._drop_first()
                    raise
                self._cuts.ran()
                del pending[0]
                if ok:
                    carry += [(value, p, i)]
            raising = False
        finally:
            restore_globals(state)
            _call_all(heard, raise_first=not raising)

    def _drop_first(self) -> None:
        """The first pending sample failed: it leaves, and with the sampler's batches its
        batch-mates with it, as in torch."""
        pending, carry = self._pending, self._carry
        del pending[0]
        if not self.regroup:
            self.discarded += len(pending) + len(carry)
            pending.clear()
            carry.clear()

    def _one(self, index: int, draw: int, heard: list[Any]) -> tuple[bool, Any]:
        """Run sample ``index``; the hooks it calls are appended to ``heard`` (``_run`` calls
        them once the loop's global generators are back)."""
        out = run_cached(self.cache, self.runner.run, index, 0, None, self.base_seed,
                         self.epoch, self.cache_row, draw=draw)  # globals: _run puts them back
        if out.error is None:
            heard.append((self.hooks.on_sample, (index, sum(t.wall for t in out.timings), False,
                                                 out.timings, out.bytes_in)))
            return True, out.value
        step, exc, tb = out.error
        err: StepError = step_error_for(
            type(exc), index, self.runner.names[step], type(exc).__qualname__, message_of(exc),
            tb,
            instance=exc,
        )
        if self.on_error == "raise":
            self.failed += 1
            raise err from exc  # for this batch only: the next next() goes on, as in torch
        self.skipped += 1
        heard.append((self.hooks.on_skip, (index, err)))
        return False, None

    def _stop_reading(self, e: BaseException) -> None:
        """The sampler raised ``e``, or something interrupted a group's read (a Ctrl-C): the
        sampler cannot be read on from where it stopped (a generator that raised is done, and
        read on it ended the epoch early, finished for ``state_dict()`` too). What was loaded
        goes out first; then the epoch ends unfinished (``state_dict()`` resumes it) with the
        sampler's error, or after an interrupt an error saying so, as with worker processes
        (``runtime/feed.py``)."""
        self._stopped = e if isinstance(e, Exception) else RuntimeError(
            f"the sampler was interrupted while it was read ({type(e).__name__}): the rest "
            "of this epoch cannot be read from it; state_dict() resumes it")

    def give_back(self, batch: Any, positions: Any) -> None:
        self._again = (batch, positions)

    def settled_undelivered(self) -> int:
        return self.skipped + self.failed + self.discarded + self.dropped

    def stats(self) -> EpochStats:
        return self.meter.snapshot(self.meter.samples, 0, self.skipped, 0, 0.0, failed=self.failed,
                                   dropped=self.dropped)


def _call_all(heard: list[tuple[Callable[..., Any], tuple[Any, ...]]],
              raise_first: bool) -> None:
    """Call every hook ``_run`` collected, in order; then, with ``raise_first`` (``_run`` is
    not raising an error of its own, a ``StepError``, which a hook's must not replace), raise
    the first hook's error.
    Called one by one, a hook that raised lost the later samples' hooks (the monitor and the
    listeners missed them) and replaced a sample's ``StepError`` (a review)."""
    first: BaseException | None = None
    for hook, args in heard:
        try:
            hook(*args)
        except Exception as e:  # noqa: BLE001 - raised once every hook ran
            if first is None:
                first = e
    if first is not None and raise_first:
        try:
            raise first
        finally:
            first = None


class _SamplerError:
    """The error a sampler raised at :meth:`InProcessIterator.read_end`'s read, kept for the
    next ``next()`` (a generator that raised is finished: read again, it would just end)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error
