"""The sampler's feed: read by the training thread as batches settle (pure, no threads)."""

from __future__ import annotations

import pytest

from headrace.runtime.bitmap import Bitmap
from headrace.runtime.epochs import runs_after_resume
from headrace.runtime.feed import Feed, NotYet


class Counting:
    """An iterator over ``items`` that counts the elements read; raises ``error`` at the end."""

    def __init__(self, items, error=None):
        self.items = list(items)
        self.error = error
        self.read = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.read == len(self.items):
            if self.error is not None:
                raise self.error
            raise StopIteration
        self.read += 1
        return self.items[self.read - 1]


def test_reads_until_ahead_positions_are_fed_past_the_settled_ones():
    src = Counting(range(100))
    feed = Feed(src, auto_collation=False, ahead=8)
    assert feed.top_up(0) and src.read == 8
    assert [next(feed) for _ in range(3)] == [0, 1, 2]
    assert not feed.top_up(0) and src.read == 8  # nothing settled: nothing more read
    assert feed.top_up(4) and src.read == 12  # four settled: four more
    assert list(_drain(feed)) == list(range(3, 12))


def test_batches_count_their_positions_and_generators_are_read_once():
    src = Counting([(i for i in (0, 1, 2)), [3, 4, 5], [6, 7, 8]])
    feed = Feed(src, auto_collation=True, ahead=5)
    feed.top_up(0)
    assert src.read == 2 and [next(feed), next(feed)] == [[0, 1, 2], [3, 4, 5]]


def test_samples_a_resumed_epoch_will_not_run_are_not_counted_as_fed():
    delivered = Bitmap()
    for p in (0, 1, 2, 5):
        delivered.set(p)
    src = Counting(range(20))
    feed = Feed(src, auto_collation=False, ahead=4, runs=runs_after_resume(delivered, None))
    feed.top_up(0)
    assert src.read == 8  # positions 0..7, of which 3, 4, 6, 7 will run


def test_under_ods_a_resumed_epoch_leaves_out_sampler_indices_not_positions():
    # ODS records deliveries by sample: indices 10 and 11 came before the cut, wherever the
    # replayed sampler puts them (the scheduler's rule: OdsEpoch.fill)
    class Ods:
        resumed = Bitmap()

    Ods.resumed.set(10)
    Ods.resumed.set(11)
    src = Counting([[11, 3], [10, 4], [5, 6]])
    feed = Feed(src, auto_collation=True, ahead=3, runs=runs_after_resume(Bitmap(), Ods()))
    feed.top_up(0)
    assert src.read == 3 and feed.fed == 4  # 3, 4, then both of [5, 6]
    assert runs_after_resume(Bitmap(), None) is None  # nothing delivered: everything runs


def test_the_end_and_a_sampler_error_come_after_every_element_read_before_them():
    feed = Feed(Counting([1, 2], error=ValueError("bad sampler")), False, ahead=10)
    assert feed.top_up(0)
    assert [next(feed), next(feed)] == [1, 2]
    with pytest.raises(ValueError, match="bad sampler") as raised:
        next(feed)
    # kept without the frame that read it (that frame holds the feed: a reference cycle)
    frames = [f.name for f in raised.traceback]
    assert "top_up" not in frames and "__next__" in frames
    with pytest.raises(StopIteration):  # given once; the epoch ended with it
        next(feed)
    done = Feed(Counting([7]), False, ahead=10)
    done.top_up(0)
    assert list(done) == [7]


def test_an_empty_feed_asks_the_training_thread_once_until_it_reads_again():
    asked = []
    feed = Feed(Counting(range(10)), False, ahead=2)
    feed.on_empty = lambda: asked.append(1)
    with pytest.raises(NotYet):
        next(feed)
    with pytest.raises(NotYet):
        next(feed)
    assert asked == [1]  # asked once
    feed.top_up(0)
    assert [next(feed), next(feed)] == [0, 1]
    with pytest.raises(NotYet):
        next(feed)
    assert asked == [1, 1]


def _drain(feed):
    while True:
        try:
            yield next(feed)
        except (NotYet, StopIteration):
            return


def test_empty_batches_count_as_one_so_endless_ones_are_read_boundedly():
    def empties():
        while True:
            yield []

    feed = Feed(empties(), auto_collation=True, ahead=4)
    feed.top_up(0)
    assert feed.fed == 4 and len(list(_drain(feed))) == 4


def test_one_top_up_reads_a_bounded_number_of_positions():
    # a resumed epoch whose delivered positions all come first: they are read past, a bounded
    # stretch at a time (the scheduler asks for the next), not all at once
    from headrace.runtime import feed as feed_module

    src = Counting(range(3 * feed_module.MAX_READ))
    feed = Feed(src, auto_collation=False, ahead=8, runs=lambda p, i: False)
    assert feed.top_up(0) and src.read == feed_module.MAX_READ
    feed.top_up(0)
    assert src.read == 2 * feed_module.MAX_READ


class Interrupt(BaseException):
    pass


def test_an_interrupted_read_raises_at_once_and_ends_the_reading():
    def sampler():
        yield 0
        raise Interrupt

    feed = Feed(sampler(), auto_collation=False, ahead=10)
    with pytest.raises(Interrupt):
        feed.top_up(0)
    assert next(feed) == 0  # what was read before stays
    with pytest.raises(RuntimeError, match="interrupted while it was read"):
        next(feed)


def test_an_interrupt_between_reading_a_group_and_queueing_it_ends_the_reading():
    """A Ctrl-C landing after the sampler gave a group and before it was queued (here in the
    resume rule, the one call in between) lost the group without a word: the feed went on
    reading after it, and the epoch ended without its samples."""
    calls = {"n": 0}

    def runs(position, index):
        calls["n"] += 1
        if calls["n"] == 3:  # the second group's first position
            raise Interrupt
        return True

    feed = Feed(Counting([[0, 1], [2, 3], [4, 5]]), auto_collation=True, ahead=10, runs=runs)
    with pytest.raises(Interrupt):
        feed.top_up(0)
    assert next(feed) == [0, 1]
    assert feed.positions == 2 and feed.fed == 2  # nothing of the interrupted group counted
    assert not feed.top_up(0)  # the sampler is not read on
    with pytest.raises(RuntimeError, match="interrupted while it was read"):
        next(feed)
