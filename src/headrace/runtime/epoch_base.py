"""What every epoch iterator shares (``runtime/epoch.py`` with workers, ``runtime/inprocess.py``
with ``num_workers=0``): its meter, the closing protocol, and delivery, which a Ctrl-C may
interrupt anywhere (``deliver``, ``give_back``, ``_end_with``)."""

from __future__ import annotations

import time
from typing import Any

from headrace.errors import LoaderClosedError
from headrace.runtime.bitmap import Bitmap
from headrace.telemetry.stats import EpochStats


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

    def began(self, t0: float) -> None:
        """The epoch began at ``t0`` (``time.perf_counter()``), when ``iter(loader)`` was
        entered, before its order was drawn, its forms planned and its workers forked: that time
        counts in the wall time and as stall (the training loop waited for the loader)."""
        now = time.perf_counter()
        self.stall_s += now - t0
        self.t_start = t0

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
        self.batches_before = 0  # batches the epoch delivered before its resume (a state dict's)
        self.padding: Any = None  # runtime/padding.py's Padding: a DDP rank's epoch, padded
        self._closed = False
        self._replaced = False
        self._ending: BaseException | None = None  # see _end_with
        self._after_end: tuple[type[Exception], str] | None = None  # see halting and broken
        self._end_unread = False  # halted where the sampler may end next (see halting)

    def __iter__(self) -> EpochBase:
        return self

    def __len__(self) -> int:
        """Batches in an epoch of the loader (torch's iterators answer ``len()`` the same way)."""
        return len(self.loader) if self.loader is not None else 0

    def _check_open(self) -> None:
        """``StopIteration`` once closed; a clear error if a newer ``iter(loader)`` took this
        epoch's persistent workers (torch would silently reset the shared iterator) or
        ``loader.close()`` stopped the epoch part-way (:meth:`halting`)."""
        if self._replaced:
            raise RuntimeError(
                "this DataLoader iterator was replaced by a newer iter(loader): with "
                "persistent_workers=True the workers are shared, so only the newest iterator "
                "runs. Finish one epoch before starting the next, or use "
                "persistent_workers=False for independent iterators")
        error, self._ending = self._ending, None
        if error is not None:  # the close before it was interrupted (a Ctrl-C)
            try:
                raise error
            finally:
                error = None
        if self._end_unread and self._after_end is not None and self.ends_here():
            self._after_end = None  # the sampler ended there: the epoch was at its end
            if self.loader is not None:
                self.loader._ended_after_close(self)
        self.raise_if_halted()  # closed part-way: never a StopIteration
        raise StopIteration

    def raise_if_halted(self) -> None:
        """Raise what ``next()`` raises once :meth:`halting` or :meth:`broken` stopped the
        epoch part-way (``LoaderClosedError``, the error it broke on); nothing otherwise. A
        DDP rank's padding asks before each repeat: its epoch had closed when its own batches
        ended (``runtime/distributed.py``)."""
        if self._after_end is not None:
            cls, message = self._after_end
            raise cls(message)

    def broken(self, message: str) -> None:
        """The epoch is about to close on an error it cannot go on from (``message``): every
        later ``next()`` raises a ``RuntimeError`` saying so. A ``StopIteration`` there passed
        for the epoch's end."""
        self._after_end = (RuntimeError, f"this epoch ended on an error and cannot deliver the "
                                         f"rest ({message}); state_dict() resumes it in a new "
                                         "iter()")

    def halting(self, total: int | None, batches: int | None,
                why: str = "the DataLoader was closed (loader.close())",
                then: str = ("close the loader after the loop, or resume the rest with "
                             "loader.load_state_dict(loader.state_dict()) and a new "
                             "iter(loader)"), sized: bool = False) -> None:
        """``loader.close()`` (or what ``why`` says) is about to close this epoch part-way
        (``total`` samples in it, ``batches`` batches; ``None``: unknown, as for a sampler
        without a length whose end was not read, which ``runtime/span.py`` never guesses):
        every later ``next()`` raises ``LoaderClosedError`` saying what was delivered and what
        was not. It ended with a ``StopIteration``, which a training loop takes for the epoch's
        end: the rest was lost without a word. An epoch whose sampler ends next, though it gave
        fewer positions than its ``__len__`` said (:meth:`ends_here`), is at its end: nothing
        was lost, and it stops as a finished one does (``sized``: the sampler has a length, which
        may be wrong; one without is never read for its end). Whether it ends is read at the next
        ``next()`` (``_check_open``), as torch would read it there, not here: a close reads no
        sampler (one drawing from the global generators moved the loop's later draws, one
        waiting on the loop blocked the close; a review)."""
        self._end_unread = sized and not self.batches_owed
        m = self.meter
        before = self.delivered_before
        repeats = self.padding.paid if self.padding is not None else 0  # a DDP rank's padding
        done = m.batches + repeats  # batches this iterator yielded
        if total is None:
            left = ("how much was not is unknown (the sampler has no length, or gave more "
                    "than its __len__, and its end was not read yet)")
        else:
            samples = total - self.delivered.count - self.settled_undelivered()
            what = (f"{samples} samples" if not (repeats or self.batches_owed) or samples
                    else "repeats of its last batch, no sample")
            left = (f"{batches - done} of its {batches} batches ({what}) were not"
                    if not before and batches is not None
                    else f"{samples} of its {total} samples were not")
        self._after_end = (LoaderClosedError, (
            f"{why} part-way through epoch {m.epoch}: "
            f"{done} batch(es) were delivered{' since the resume' if before else ''}"
            + (f" ({repeats} of them its last batch repeated: the padding every DDP rank's "
               "epoch takes to give len(loader) batches)" if repeats else "")
            + f", and {left}. This iterator cannot deliver the rest: {then}"))

    def _end_with(self, error: BaseException) -> None:
        """Close the epoch, then raise ``error`` (what ends it unfinished); the next
        ``next()`` raises it should something interrupt the close (joining the workers takes
        a while: a Ctrl-C there replaced the error, and the epoch then looked done)."""
        self._ending = error
        self.close()
        self._ending = None
        try:
            raise error
        finally:  # this frame is in the error's traceback: it must not hold the error itself
            error = None  # type: ignore[assignment]

    def __next__(self) -> Any:
        got = self.take()
        assert got is not None  # a blocking take returns a batch or raises
        try:
            self.deliver(got[1])
        except BaseException:  # a Ctrl-C while it was marked: the next next() returns it
            self.give_back(*got)
            raise
        return got[0]

    def take(self, block: bool = True) -> tuple[Any, Any] | None:
        """The next batch and its positions, not yet delivered (``mark`` delivers it).

        ``block=False``: ``None`` when no batch is ready yet or the epoch's end is next (the
        end is then kept for the next blocking call). Raises ``StopIteration`` at the end.
        """
        raise NotImplementedError

    def settled_undelivered(self) -> int:
        """Positions of this run of the epoch that are settled without being delivered
        (skipped, failed, dropped with a batch): with the delivered ones, the epoch's length
        once its last batch is out."""
        return 0

    def ends_here(self) -> bool:
        """Whether every position the sampler gave is settled and its end is next, which
        :meth:`known_length` does not tell yet (``num_workers=0`` reads the sampler a batch at a
        time; the workers' feed reads it ahead, so its end is known already). False here."""
        return False

    def known_length(self) -> int | None:
        """The epoch's positions once its sampler was read to its end in this run (it stopped,
        neither raising nor interrupted), before a resume included; ``None`` while they are
        unknown. What tells a sampler without ``__len__`` that every position is settled
        (``runtime/span.py``)."""
        return None

    def give_back(self, batch: Any, positions: Any) -> None:
        """A batch ``take`` returned did not reach the training loop (an interrupt such as
        Ctrl-C while :meth:`deliver` marked it): the next ``take`` returns it again."""
        raise NotImplementedError

    def deliver(self, positions: Any) -> None:
        """:meth:`mark`, undone when something interrupts it (a Ctrl-C lands between two
        bytecodes, in it or in what it calls: the sampler's read, the scheduler's wake-up):
        the batch is then not delivered, for ``state_dict()`` too, and its caller keeps it for
        the next ``next()`` (:meth:`give_back`). Before, the interrupted ``next()`` had taken
        the batch and returned nothing: it was lost for the rest of the epoch, which ended
        without a word (and a ``state_dict()`` skipped it if its positions were marked)."""
        before = self.meter.batches
        keys = self.sample_keys(positions)
        last = self.padding.last if self.padding is not None else None
        try:
            self.mark(positions, keys)
        except BaseException:
            if self.padding is not None:
                self.padding.last = last
            for k in keys:  # none was delivered before: a position comes in one batch
                self.delivered.clear(k)
            if self.ods is not None:  # the batch comes back: its positions are asked again
                self.ods.keep(positions, keys)
            if self.meter.batches > before:  # the counts come last in mark: all or none
                n = len(positions)
                self.meter.batches -= 1
                self.meter.samples -= n
                if not n:
                    self.empty_batches -= 1
            raise

    def sample_keys(self, positions: Any) -> Any:
        """What the delivered bitmap records for each of ``positions``: the position itself,
        or under ODS the index that filled it (``OdsEpoch.index_of``)."""
        ods = self.ods
        return positions if ods is None else [ods.index_of(p) for p in positions]

    def mark(self, positions: Any, keys: Any) -> None:
        """The batch at ``positions`` reached the training loop: it is delivered. ``keys``:
        :meth:`sample_keys` of ``positions``."""
        n = len(positions)
        for k in keys:
            self.delivered.set(k)
        if self.padding is not None:  # the batch a DDP rank repeats (runtime/padding.py)
            self.padding.last = keys
        if not n:  # a batch sampler's empty batch: counted, a resume skips as many
            self.empty_batches += 1
        self.meter.batches += 1
        self.meter.samples += n
        if self.ods is not None:
            self.ods.forget(positions)

    @property
    def delivered_before(self) -> int:
        """Positions delivered before this epoch's resume (0 for an epoch run from its start)."""
        return int(self.delivered.count - self.meter.samples)

    @property
    def batches_delivered(self) -> int | None:
        """Batches this epoch delivered, those before its resume included, and a DDP rank's
        padding (``runtime/padding.py``); ``None`` where those are unknown (a state dict that
        did not count them in this loader's batch settings)."""
        if self.delivered_before and not self.batches_before:
            return None
        paid = self.padding.paid if self.padding is not None else 0
        return self.batches_before + self.meter.batches + paid

    @property
    def batches_owed(self) -> int:
        """Batches this DDP rank's padded epoch still owes to reach the count every rank takes,
        padding included (0: none, or not padded): until they are paid the epoch is not over
        (``span.at_end``)."""
        return self.padding.owed(self.batches_delivered) if self.padding is not None else 0

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
        owed = self.batches_owed  # a DDP rank's padding to come (runtime/padding.py)
        if self.loader is not None and (not self.finished or owed):
            self.loader._abandoned(self)  # state_dict() still describes this epoch
        self.hooks.on_epoch_closed(self.stats(), self.delivered_before, padded=bool(owed))

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
