"""The queue depth and hold time of worker processes (planner/queueing.py): pure policy."""

import math

import pytest

from headrace.planner.queueing import (
    CHEAP_HOLD_S,
    CHEAP_QUEUE_S,
    CHEAP_S,
    HOLD_S,
    MAX_DEPTH,
    MIN_DEPTH,
    QUEUE_BYTES,
    QUEUE_S,
    hold_s,
    queue_depth,
)


@pytest.mark.parametrize("typical", [math.nan, math.inf, 0.0, -1.0])
def test_unknown_sample_time_keeps_one_running_and_one_queued(typical):
    assert queue_depth(typical) == MIN_DEPTH
    assert hold_s(queue_depth(typical)) == 0.0


def test_samples_of_milliseconds_keep_the_two_at_a_time_rule_and_send_at_once():
    for typical in (QUEUE_S / 2, 0.005, 0.05, 1.0):  # imagenet's ~5 ms, speech's 50 ms
        assert queue_depth(typical) == MIN_DEPTH
        assert hold_s(MIN_DEPTH) == 0.0


def test_samples_of_one_to_two_ms_are_queued_to_cover_queue_s_and_held_hold_s():
    assert queue_depth(QUEUE_S / 3) == 3
    assert queue_depth(QUEUE_S / 3.5) == 4  # rounded up: at least QUEUE_S of work queued
    assert queue_depth(CHEAP_S) == 4
    for typical in (CHEAP_S, 0.0015, QUEUE_S / MIN_DEPTH - 1e-6):
        assert hold_s(queue_depth(typical)) == HOLD_S


def test_samples_under_cheap_s_share_longer_messages_up_to_the_cap():
    assert queue_depth(CHEAP_S * 0.999) == math.ceil(CHEAP_QUEUE_S / (CHEAP_S * 0.999))
    assert queue_depth(200e-6) == min(MAX_DEPTH, math.ceil(CHEAP_QUEUE_S / 200e-6)) == 80
    assert queue_depth(1e-9) == MAX_DEPTH
    for typical in (CHEAP_S * 0.999, 200e-6, 1e-6, 1e-9):
        assert hold_s(queue_depth(typical)) == CHEAP_HOLD_S
    # the hold stays a quarter of the work queued, in either tier
    assert CHEAP_HOLD_S / CHEAP_QUEUE_S == HOLD_S / QUEUE_S == 0.25


def test_depth_never_grows_as_samples_get_slower():
    times = [10 ** (k / 10) * 1e-6 for k in range(0, 60)]  # 1 µs .. ~1 s
    depths = [queue_depth(t) for t in times]
    assert depths == sorted(depths, reverse=True)
    assert depths[0] == MAX_DEPTH and depths[-1] == MIN_DEPTH


def test_describe_says_what_the_typical_sample_gave_and_what_came_shared():
    from headrace.planner.queueing import describe

    assert "not measured yet" in describe(math.nan, MIN_DEPTH, None, None)
    slow = describe(0.0045, MIN_DEPTH, 0, 960)
    assert "one per sample" in slow and "4.5 ms" in slow and "under 2.0 ms" in slow
    assert "0 of 960" in slow
    cheap = describe(70e-6, 128, 19500, 20000)
    assert "128 at once" in cheap and "70 µs" in cheap and "19500 of 20000" in cheap
    assert "within 4.0 ms" in cheap
    assert "within 1.0 ms" in describe(1.5e-3, 3, 900, 960)
    assert "last epoch" not in describe(70e-6, 32, None, None)


def test_large_samples_are_queued_no_deeper_than_queue_bytes_allows():
    # 20 MB samples of 1.5 ms were queued three at a time: 120 MB of each worker's ring resident
    mb = 1 << 20
    assert queue_depth(1.5e-3) == 3 and queue_depth(1.5e-3, 20 * mb) == MIN_DEPTH
    assert queue_depth(200e-6, 12 * 1024) == 80  # CIFAR-sized: not capped
    assert queue_depth(200e-6, 1 * mb) == QUEUE_BYTES // mb == 8
    assert hold_s(queue_depth(200e-6, 1 * mb)) == CHEAP_HOLD_S
    assert queue_depth(200e-6, 3 * mb) == 2 and hold_s(2) == 0.0
    assert queue_depth(200e-6, 0) == 80  # size unknown: by time alone
    assert queue_depth(0.05, 1) == MIN_DEPTH  # bytes never deepen a queue
    for nbytes in (1, 1024, mb, 64 * mb):
        depths = [queue_depth(10 ** (k / 10) * 1e-6, nbytes) for k in range(60)]
        assert depths == sorted(depths, reverse=True) and min(depths) >= MIN_DEPTH


def test_describe_says_when_a_samples_bytes_capped_its_queue():
    from headrace.planner.queueing import describe

    capped = describe(1.5e-3, queue_depth(1.5e-3, 20 << 20), 0, 120, 20 << 20)
    assert "one per sample" in capped and "no more than 8.4 MB of samples of 21.0 MB" in capped
    assert "would be queued deeper" not in capped
    deep = describe(200e-6, queue_depth(200e-6, 1 << 20), 0, 120, 1 << 20)
    assert "8 at once" in deep and "no more than 8.4 MB" in deep
    assert "no more than" not in describe(1.5e-3, queue_depth(1.5e-3, 1024), 0, 120, 1024)


def test_a_queue_its_bytes_capped_holds_no_longer_than_a_quarter_of_its_work():
    # a review: 8 samples of 1 MiB and 200 µs queued (1.6 ms of work) kept a 4 ms hold, which
    # never came due: the worker sent only once it ran dry, then waited for its refill
    depth = queue_depth(200e-6, 1 << 20)
    assert depth == 8 and hold_s(depth, 200e-6) == pytest.approx(8 * 200e-6 / 4)
    for k in range(60):  # not capped: the tier's hold, MAX_DEPTH's cap included
        t = 10 ** (k / 10) * 1e-6
        assert hold_s(queue_depth(t), t) == hold_s(queue_depth(t))
        d = queue_depth(t, 2 << 20)
        assert hold_s(d, t) <= max(hold_s(queue_depth(t)) if d == queue_depth(t) else 0.0,
                                   d * t / 4)
