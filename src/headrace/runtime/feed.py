"""The sampler's elements, read in the training loop's thread, as torch's loader reads them.

A sampler may draw from the global generators as it yields: an infinite random sampler
(``yield torch.randint(n, ()).item()``), a shard shuffler drawing a new permutation per shard.
Read on the scheduler thread, those draws interleave with the training loop's own (dropout, a
random schedule) in an order that thread timing sets: other samples and other training draws
in each run (a compatibility sweep: 3 of 4 seeded runs differed, and none matched torch). torch
reads its sampler in the training thread, at ``iter()`` and after each batch it hands over.

So does headrace: at ``iter()`` and each time a batch reaches the training loop, the training
thread reads the sampler until ``ahead`` samples to run are fed past those settled (delivered
to the training loop or raised there in their batch's place, skipped, failed or discarded: what
the scheduler counts out of flight, so the feed never holds the scheduler below its bound for
long); the scheduler thread takes the fed elements (``next(feed)``) and raises :class:`NotYet`
when none is there. Until a sample fails, how many elements are read before each ``next()``
returns depends on the batches delivered alone, never on timing; a failure settles samples at
a time set by the workers. Should the scheduler find the feed empty with room to dispatch (a
failure, batches taken ahead of their delivery by the device prefetcher), ``on_empty`` asks
the training thread for more (``EpochIterator`` wakes it). Positions a resumed epoch
delivered before never run, so they are not counted as fed (``runs``): the feed reads past
them, as the scheduler skips them.

An error the sampler raises is kept and given to the scheduler after every element read
before it, so the epoch delivers those samples, then raises it (as torch does without workers);
the epoch stays unfinished, so ``state_dict()`` resumes it. A ``BaseException`` (Ctrl-C, a
preemption) goes to the caller at once; the batch being delivered is marked only after its read
(``EpochIterator.mark``). An empty batch counts as one sample read ahead, and one call reads at
most ``MAX_READ`` positions, so neither endless empty batches nor a resumed epoch's delivered
stretch is read all at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

MAX_READ = 1 << 16
"""Most positions one :meth:`Feed.top_up` reads: a resumed epoch reads past the positions it
delivered before, and all at once they were a list per sampler batch, O(dataset) in memory;
the scheduler asks for more once it has taken these."""


class NotYet(Exception):  # noqa: N818 - a state, not a failure
    """Nothing fed yet: the training thread reads more at its next turn."""


class Feed:
    """An iterator over ``groups`` (the sampler's elements) that only the training thread
    advances (:meth:`top_up`); the scheduler thread takes what it read.

    ``auto_collation``: each element is a batch of indices (``len`` positions), else one index.
    ``ahead``: samples to keep fed past those settled (the epoch's in-flight bound).
    ``per_batch``: count in batches instead (a user ``batch_sampler``'s groups, delivered
    whole): ``ahead`` and ``settled`` are batches, each group one (none when a resumed epoch
    runs none of its samples), so the sampler is read torch's ``prefetch_factor × workers``
    batches ahead of the batches delivered or raised, whatever their sizes.
    ``runs(position, index)``: whether that sample will run, the scheduler's own rule (a
    resumed epoch leaves out what it delivered before: by position, or by sampler index under
    ODS); ``None``: every one runs.
    """

    def __init__(self, groups: Iterator[Any], auto_collation: bool, ahead: int,
                 runs: Callable[[int, Any], bool] | None = None,
                 per_batch: bool = False) -> None:
        self._groups = groups
        self.per_batch = per_batch
        self._auto = auto_collation
        self._runs = runs
        self.ahead = ahead
        self._items: deque[Any] = deque()
        self._ended = False  # the sampler stopped (or raised)
        self.read_to_end = False  # it stopped with StopIteration: ``positions`` is the epoch's
        self._error: Exception | None = None  # what it raised, until given to the scheduler
        self.positions = 0  # positions read from the sampler
        self.fed = 0  # samples to run among them (what the scheduler will count as pulled);
        # with ``per_batch``, groups with a sample to run (or empty)
        self.asked = False  # on_empty was called and no top-up followed yet
        self.on_empty: Callable[[], None] = _nothing

    # -- training thread ------------------------------------------------------------------------
    def top_up(self, settled: int) -> bool:
        """Read the sampler until ``ahead`` samples to run are fed past ``settled`` (samples
        out of flight, as the scheduler counts them); True when something new is there for the
        scheduler (an element, or the end)."""
        self.asked = False
        added = False
        read = 0
        while not self._ended and self.fed - settled < self.ahead and read < MAX_READ:
            try:
                group = next(self._groups)
                if self._auto and type(group) is not list:  # (the order digest made one)
                    group = list(group)  # a batch sampler may yield generators: read once
            except StopIteration:
                self._ended = self.read_to_end = True
            except Exception as e:  # noqa: BLE001 - the sampler's: raised after what came before
                self._ended, self._error = True, detached(e)
            except BaseException as e:  # Ctrl-C, SystemExit: to the caller at once
                self._interrupted(e)
                raise
            else:
                try:
                    read += self._queue(group)
                except BaseException as e:  # between reading the group and queueing it
                    self._interrupted(e)
                    raise
                added = True
                continue
            added = True
        return added

    def _queue(self, group: Any) -> int:
        """Count ``group``'s positions and samples to run, then queue it for the scheduler;
        the positions it read. Interrupted part-way (a Ctrl-C between two of these lines), the
        group was read and not queued: the feed ends (:meth:`_interrupted`)."""
        n = len(group) if self._auto else 1
        start = self.positions
        runs = self._runs
        # an empty batch counts as one: it is delivered (and settled) as a batch, and endless
        # empty ones must not keep the reading loop going
        to_run = max(1, n) if runs is None or not n else sum(
            map(runs, range(start, start + n), group if self._auto else [group]))
        if self.per_batch:
            to_run = min(1, to_run)
        self.positions = start + n
        self.fed += to_run
        self._items.append(group)
        return max(1, n)

    def _interrupted(self, e: BaseException) -> None:
        """A ``BaseException`` (Ctrl-C, SystemExit) while a group was read or queued: the
        sampler cannot be read on from where it stopped, so the scheduler gets, after what was
        queued before, an error that ends the epoch (unfinished: ``state_dict()`` resumes it).
        Read on, a group read and never queued was lost without a word (its samples never ran,
        and with a small in-flight bound the epoch waited for them for ever)."""
        self._ended, self._error = True, RuntimeError(
            f"the sampler was interrupted while it was read ({type(e).__name__}): the rest of "
            "this epoch cannot be read from it; state_dict() resumes it")

    # -- scheduler thread ------------------------------------------------------------------------
    def __iter__(self) -> Feed:
        return self

    def __next__(self) -> Any:
        if self._items:
            return self._items.popleft()
        if not self._ended:
            if not self.asked:
                self.asked = True
                self.on_empty()
            raise NotYet
        if self._items:  # fed between the two reads above, before the end was set
            return self._items.popleft()
        error, self._error = self._error, None  # given once (the epoch ends with it)
        self.on_empty = _nothing  # (it holds the batch queue, which may hold the error)
        if error is None:
            raise StopIteration
        tb = error.__traceback__  # the sampler's own frames
        try:
            raise error
        finally:
            # as it leaves, the error's traceback goes back to the sampler's frames: with this
            # frame in it, the frames that called it (the scheduler thread's, holding the
            # scheduler that queues the error) came too, a cycle that kept the epoch alive
            # until the garbage collector ran; and this frame must not hold the error
            error.__traceback__ = tb
            error = tb = None


def _nothing() -> None:
    pass


def detached(e: Exception) -> Exception:
    """``e`` without the frame that caught it, to be kept by the object whose method caught
    it: that frame holds the object, a cycle that would keep the epoch (its scheduler, its
    sampler) alive until the garbage collector ran."""
    tb = e.__traceback__
    return e.with_traceback(tb.tb_next if tb is not None else None)
