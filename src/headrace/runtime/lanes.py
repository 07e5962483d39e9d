"""The epoch's work not yet on a worker, and how far the sampler has been read.

Plain bookkeeping for the scheduler thread (``runtime/scheduler.py``), no threads or processes:

* ``fresh``: positions pulled from the sampler, not yet dispatched (the fast lane's input);
* ``retry``: samples whose worker died, run again first;
* ``backlog``: the slow lane, samples handed off over the learned timeout, waiting to resume at
  their next step (MinatoLoader Algorithm 1);
* ``recs``: every sample dispatched and not finished, by task id.

The cap on samples in flight applies when a sampler batch is pulled, never inside one: with
``in_order=True`` or a user batch sampler a half-dispatched batch could never complete.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from headrace.runtime.draws import Draws
from headrace.runtime.feed import Feed, NotYet, detached
from headrace.runtime.span import hinted
from headrace.runtime.work import EpochSpec, Rec
from headrace.runtime.worker import Task


class Lanes:
    def __init__(self, spec: EpochSpec, tids: Iterator[int]) -> None:
        self.spec = spec
        self.tids = tids  # task ids, unique over the pool's life
        self.recs: dict[int, Rec] = {}
        self.retry: deque[Rec] = deque()
        self.backlog: deque[Rec] = deque()
        self.fresh: deque[tuple[int, int]] = deque()  # (position, dataset index)
        self.positions = 0  # positions pulled from the sampler so far
        self.pulled = 0  # positions pulled and not already delivered (counted in flight)
        self.settled = 0  # positions completed, skipped or failed
        self.exhausted = False
        self.draws = Draws(spec.may_repeat)  # how many times each index came before
        self.empty_groups = 0  # empty sampler batches so far (keyed -1, -2, ...: no position)
        self.repeats: dict[int, int] = {}  # position -> its draw, for the positions above 0
        self.error: Exception | None = None  # what the sampler raised: the epoch's end

    @property
    def complete(self) -> bool:
        """Every position of the epoch was pulled and settled."""
        return self.exhausted and not self.fresh and self.settled == self.pulled

    def choose(self, fresh_ok: bool, slow_first: Callable[[], bool], in_flight: int,
               backlog_ok: bool = True, runs: Callable[[Task], bool] | None = None
               ) -> Rec | None:
        """The next sample for a worker: a retry, else the slow lane when ``slow_first()`` (the
        scheduler's rule: the slow lane has less than its share of the workers), else a fresh
        sample (when ``fresh_ok``), else the slow lane anyway (nothing fresh may start: stay
        work-conserving). ``backlog_ok=False``: never the slow lane (a near-storage fetcher).
        ``runs(task)``: which retries and slow-lane samples the worker may take (a remote
        worker: those with steps left before its split point; None: any), the first such in
        each queue."""
        rec = _take(self.retry, runs)
        if rec is not None:
            return rec
        if not backlog_ok:
            return self.next_fresh(in_flight) if fresh_ok else None
        if self.backlog and slow_first():
            rec = _take(self.backlog, runs)
            if rec is not None:
                return rec
        if fresh_ok:
            rec = self.next_fresh(in_flight)
            if rec is not None:
                return rec
        return _take(self.backlog, runs)

    def near_end(self, margin: int) -> bool:
        """At most ``margin`` fresh samples are left: queue none behind a running one (no tail
        waiting behind a slow sample). Counted from the positions the sampler gave
        (:func:`fresh_left`), its ``__len__`` a hint only: an oversampler past its length was
        near its end for the whole rest of the epoch (one sample per worker at a time), and
        one that gave less was never near it. Written out here: it is asked per task
        dispatched (150 ns before the positions read counted; 520 through
        :meth:`fresh_left`)."""
        feed, total = self.spec.groups, self.spec.total_positions
        if type(feed) is Feed:  # the training thread reads it ahead of the pulls here
            read, end_read = feed.positions, feed.read_to_end or self.exhausted
        else:
            read, end_read = self.positions, self.exhausted
        if end_read:
            left = read - self.positions
        elif total is None or read > total:  # unknown (span.hinted)
            return False
        else:
            left = total - self.positions
        return (left if left > 0 else 0) + len(self.fresh) <= margin

    def fresh_left(self) -> int | None:
        """Fresh samples of the epoch not yet on a worker, as far as is known (None: unknown;
        :func:`fresh_left`)."""
        feed = self.spec.groups
        if isinstance(feed, Feed):  # the training thread reads it ahead of the pulls here
            read, end_read = feed.positions, feed.read_to_end
        else:
            read, end_read = self.positions, False
        return fresh_left(self.spec.total_positions, read, end_read or self.exhausted,
                          self.positions, len(self.fresh))

    def next_fresh(self, in_flight: int) -> Rec | None:
        """A new task for the next fresh position, pulling a sampler batch when none is left and
        fewer than ``spec.max_in_flight`` samples are in flight (any number with a
        ``spec.batch_bound``: the feed holds no more batches than it allows)."""
        s = self.spec
        while not self.fresh:
            if (self.exhausted or (s.batch_bound is None and in_flight >= s.max_in_flight)
                    or not self.pull_group()):
                return None
        position, index = self.fresh.popleft()
        task = Task(next(self.tids), index, 0, None, s.base_seed, s.epoch, s.handoff,
                    self.repeats.pop(position, 0) if self.repeats else 0)
        rec = Rec(position, index, task)
        self.recs[task.tid] = rec
        return rec

    def pull_group(self) -> bool:
        """Pull one sampler element (a batch of indices, or one index) into ``fresh``; False
        when none was read yet (``runtime/feed.py``: the training thread reads the sampler).
        An error the sampler raised ends the epoch's reading: kept in ``error`` and raised once
        what was pulled before it is delivered."""
        try:
            group = next(self.spec.groups)
        except NotYet:
            return False
        except StopIteration:
            self.exhausted = True
            return True
        except Exception as e:  # noqa: BLE001 - the sampler's own
            self.exhausted, self.error = True, detached(e)
            return True
        indices = list(group) if self.spec.auto_collation else [group]
        if not indices:  # a user batch_sampler's empty batch: collate_fn([]) in its turn
            self.empty_groups += 1
            self.spec.batcher.add_group(-self.empty_groups, [])
            return True
        start = self.positions
        self.positions += len(indices)
        positions = list(range(start, start + len(indices)))
        delivered = self.spec.delivered  # draws count every position; kept for the others
        self.repeats.update((p, n) for p, n in self.draws.repeats(positions, indices).items()
                            if p not in delivered)
        if self.spec.ods is not None:  # ODS may fill a position with another sample
            todo = self.spec.ods.fill(positions, indices)
        else:
            todo = [(p, i) for p, i in zip(positions, indices, strict=True) if p not in delivered]
        if todo:
            self.spec.batcher.add_group(start, [p for p, _ in todo])
        self.fresh.extend(todo)
        self.pulled += len(todo)
        return True


def fresh_left(length: int | None, read: int, end_read: bool, pulled: int,
               waiting: int) -> int | None:
    """Fresh samples of an epoch not yet on a worker, as far as is known; None: unknown.
    ``waiting``: those pulled and not dispatched; to them come the positions not pulled yet
    (``pulled``: how many were), out of ``read`` where the sampler was read to its end
    (``end_read``: ``read`` is then the epoch's positions), else out of its ``__len__``
    (``length``) where the sampler has not given more than that (``span.hinted``). Positions a
    resumed epoch delivered before are counted as left: an overcount of at most those."""
    if end_read:
        return max(0, read - pulled) + waiting
    total = hinted(length, read)
    return None if total is None else max(0, total - pulled) + waiting


def _take(queue: deque[Rec], runs: Callable[[Task], bool] | None) -> Rec | None:
    """The first sample of ``queue`` that ``runs`` accepts (any without it), removed."""
    if runs is None:
        return queue.popleft() if queue else None
    for k, rec in enumerate(queue):
        if runs(rec.task):
            del queue[k]
            return rec
    return None
