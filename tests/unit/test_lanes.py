"""Lanes: the scheduler's queues of work, as plain bookkeeping (no threads, no processes)."""

import itertools

from headrace.runtime.batcher import Batcher
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.feed import Feed
from headrace.runtime.lanes import Lanes, fresh_left
from headrace.runtime.work import EpochSpec, Rec
from headrace.runtime.worker import Task


def spec(groups, max_in_flight=100, delivered=None, total=None):
    return EpochSpec(epoch=0, base_seed=1, groups=iter(groups), auto_collation=True,
                     batcher=Batcher("regroup", 2), collate=list, pin=None,
                     max_in_flight=max_in_flight, handoff=True, slow_lane_share=0.25,
                     on_error="raise", max_restarts=2, delivered=delivered or Bitmap(),
                     total_positions=total)


def rec(i):
    return Rec(i, i, Task(100 + i, i, 1, None, 1, 0, False))


def test_fresh_samples_come_in_sampler_order_and_skip_delivered_positions():
    done = Bitmap()
    done.set(1)
    lanes = Lanes(spec([[10, 11], [12, 13]], delivered=done), itertools.count())
    got = [lanes.next_fresh(0) for _ in range(4)]
    assert [r.index for r in got[:3]] == [10, 12, 13] and got[3] is None
    assert lanes.pulled == 3 and lanes.exhausted and set(lanes.recs) == {0, 1, 2}


def test_the_in_flight_cap_applies_between_sampler_batches_only():
    lanes = Lanes(spec([[0, 1, 2], [3]], max_in_flight=2), itertools.count())
    assert lanes.next_fresh(0).index == 0
    assert lanes.next_fresh(5).index == 1  # inside a pulled batch: no cap
    assert lanes.next_fresh(5).index == 2
    assert lanes.next_fresh(2) is None  # pulling the next batch would exceed the cap
    assert lanes.next_fresh(1).index == 3


def test_batches_read_in_batches_are_pulled_whatever_the_samples_in_flight():
    """A user batch sampler's feed bounds the batches in flight (``batch_bound``): the cap in
    samples, from a guessed batch size of 1, would hold its second batch back."""
    s = spec([[0, 1, 2], [3, 4, 5]], max_in_flight=2)
    s.batch_bound = 4
    lanes = Lanes(s, itertools.count())
    assert [lanes.next_fresh(k).index for k in range(6)] == [0, 1, 2, 3, 4, 5]
    assert s.batches_in_flight() == 4
    assert spec([], max_in_flight=9).batches_in_flight() == 4  # 9 samples, batches of 2


def test_retry_first_then_the_slow_lane_within_its_share_then_fresh():
    lanes = Lanes(spec([[0, 1]]), itertools.count())
    slow, again = rec(7), rec(8)
    lanes.backlog.append(slow)
    lanes.retry.append(again)
    assert lanes.choose(True, lambda: True, 0) is again
    assert lanes.choose(True, lambda: False, 0).index == 0  # the slow lane's share is taken
    assert lanes.choose(False, lambda: False, 0) is slow  # nothing fresh may start: work-conserving


def test_near_end_and_complete():
    lanes = Lanes(spec([[0, 1], [2, 3]], total=4), itertools.count())
    assert not lanes.near_end(1)
    for _ in range(4):
        lanes.next_fresh(0)
    assert lanes.near_end(0) and not lanes.complete
    lanes.next_fresh(0)  # finds the sampler exhausted
    lanes.settled = 4
    assert lanes.complete


def test_a_worker_limited_to_some_resumed_samples_takes_only_those():
    # a remote worker with split point 2: a sample handed back at step 2 is the local
    # workers' to finish; one handed off at step 1 (over the timeout) it may resume
    def at(i, start):
        return Rec(i, i, Task(100 + i, i, start, None, 1, 0, False))

    lanes = Lanes(spec([[0]]), itertools.count())
    lanes.retry.append(at(5, 2))
    lanes.backlog.extend([at(6, 2), at(7, 1)])

    def before_split(t):
        return t.start < 2

    assert lanes.choose(False, lambda: True, 0, runs=before_split).index == 7
    assert lanes.choose(False, lambda: True, 0, runs=before_split) is None
    assert lanes.choose(True, lambda: True, 0, runs=before_split).index == 0  # fresh: any
    assert [r.index for r in lanes.retry] == [5] and [r.index for r in lanes.backlog] == [6]
    assert lanes.choose(False, lambda: True, 0).index == 5  # a local worker: the retry first
    assert lanes.choose(False, lambda: True, 0).index == 6


def test_fresh_left_counts_the_positions_the_sampler_gave_its_length_a_hint():
    assert fresh_left(10, 4, False, 4, 2) == 8  # a length that is right: 6 to pull, 2 waiting
    assert fresh_left(10, 14, False, 14, 2) is None  # given past its length: unknown (was -2)
    assert fresh_left(10, 20, True, 18, 1) == 3  # its end read: 2 to pull, 1 waiting
    assert fresh_left(10, 4, True, 4, 1) == 1  # gave less than its length, end read (was 7)
    assert fresh_left(None, 3, False, 3, 0) is None  # no length, end not read
    assert fresh_left(None, 3, True, 3, 0) == 0


def fed(groups, total):
    """Lanes over a ``Feed`` (as the scheduler's are), read ahead as far as ``top_up`` goes."""
    feed = Feed(iter(groups), True, ahead=100)
    s = spec([], total=total)
    s.groups = feed
    return Lanes(s, itertools.count()), feed


def test_an_oversampler_past_its_length_is_near_its_end_only_at_its_end():
    """It gives 12 positions, its ``__len__`` says 4: past 4 the epoch's end was taken as near
    (each worker held one sample at a time for the rest of the epoch)."""
    lanes, feed = fed([[0, 1], [2, 3], [0, 1], [2, 3], [0, 1], [2, 3]], total=4)
    feed.ahead = 6
    feed.top_up(0)  # 6 positions read, the end not yet
    for _ in range(5):
        lanes.next_fresh(0)
    assert lanes.positions == 6 and not lanes.near_end(2)  # 1 fresh waiting, the rest unknown
    feed.ahead = 100
    feed.top_up(6)  # the rest read, and the end
    assert feed.read_to_end and not lanes.near_end(2)  # 7 fresh left
    for _ in range(5):
        lanes.next_fresh(0)
    assert lanes.near_end(2) and not lanes.near_end(1)  # 2 left


def test_an_undersampler_is_near_its_end_once_its_end_is_read():
    """It gives 4 positions, its ``__len__`` says 100: the epoch's end never counted as near."""
    lanes, feed = fed([[0, 1], [2, 3]], total=100)
    feed.top_up(0)
    assert feed.read_to_end
    lanes.next_fresh(0)
    assert lanes.near_end(3) and not lanes.near_end(2)  # 3 left (1 waiting, 2 to pull)


def test_near_end_says_what_fresh_left_counts():
    """``near_end`` is written out for speed (asked per task dispatched): it must keep
    ``fresh_left``'s rule, over lengths right, short, long and unknown, before and after the
    sampler's end is read, with and without a feed reading ahead."""
    for groups, total in [([[0, 1], [2, 3], [4, 5]], 6), ([[0, 1], [2, 3]], 100),
                          ([[0, 1], [2, 3], [0, 1], [2, 3]], 4), ([[0, 1], [2, 3]], None)]:
        for with_feed in (False, True):
            if with_feed:
                lanes, feed = fed(groups, total)
                feed.ahead = 2
                feed.top_up(0)
            else:
                lanes = Lanes(spec(groups, total=total), itertools.count())
            for _ in range(10):
                left = lanes.fresh_left()
                for margin in range(8):
                    assert lanes.near_end(margin) == (left is not None and left <= margin), (
                        groups, total, with_feed, lanes.positions, margin, left)
                if lanes.next_fresh(0) is None:
                    break
                if with_feed:
                    feed.top_up(lanes.positions)
