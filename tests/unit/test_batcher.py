import pytest

from headrace.runtime.batcher import Batcher, Place


def test_regroup_fills_rows_in_arrival_order_and_flushes_the_tail():
    b = Batcher("regroup", 3)
    assert b.place(7) == Place(0, 0, 3)  # a slow-lane sample takes the next row like any other
    assert b.place(1) == Place(0, 1, 3)
    assert b.pop(final=False) is None
    assert b.place(2) == Place(0, 2, 3)
    assert b.place(3) == Place(1, 0, 3)  # the next batch starts filling at once
    ready = b.pop(final=False)
    assert (ready.key, ready.rows, ready.positions) == (0, [0, 1, 2], [7, 1, 2])
    assert b.pop(final=False) is None  # one sample waiting, batch not full
    assert b.ready_samples == 1
    tail = b.pop(final=True)
    assert (tail.key, tail.rows, tail.positions) == (1, [0], [3])
    assert b.pop(final=True) is None
    assert b.ready_samples == 0


def test_ordered_yields_groups_in_sampler_order_with_rows_by_sampler_position():
    b = Batcher("ordered", 2)
    b.add_group(0, [0, 1])
    b.add_group(2, [2, 3])
    assert b.place(3) == Place(2, 1, 2)
    assert b.place(2) == Place(2, 0, 2)
    assert b.pop(False) is None  # group 0 not complete
    assert b.place(1) == Place(0, 1, 2)
    assert b.place(0) == Place(0, 0, 2)
    assert b.pop(False)[1:3] == ([0, 1], [0, 1])
    assert b.pop(False)[1:3] == ([0, 1], [2, 3])
    assert b.pop(True) is None


def test_grouped_yields_complete_groups_first_and_leaves_a_hole_for_a_skipped_sample():
    b = Batcher("grouped", None)
    b.add_group(0, [0, 1, 2])
    b.add_group(3, [3, 4])
    b.place(3)
    b.place(4)
    assert b.pop(False)[1:3] == ([0, 1], [3, 4])
    b.place(2)
    b.drop(1)
    assert b.pop(False) is None  # position 0 still running
    b.place(0)
    ready = b.pop(False)
    assert (ready.key, ready.rows, ready.positions) == (0, [0, 2], [0, 2])
    assert b.ready_samples == 0


def test_a_group_whose_samples_were_all_dropped_comes_out_empty_in_its_turn():
    b = Batcher("ordered", 1)
    b.add_group(0, [0])
    b.add_group(1, [1])
    assert b.drop(0) == 0  # the key of its sampler batch
    b.place(1)
    assert b.pop(False)[:3] == (0, [], [])  # the caller yields nothing, or raises its error
    assert b.pop(False)[1:3] == ([0], [1])
    assert b.pop(True) is None


@pytest.mark.parametrize("mode", ["ordered", "grouped"])
def test_an_empty_sampler_batch_comes_out_marked_empty_in_its_turn(mode):
    b = Batcher(mode, None)
    b.add_group(0, [0, 1])
    b.add_group(-1, [])  # a batch sampler's []: a key of its own
    b.add_group(2, [2])
    b.place(2)
    if mode == "ordered":  # behind the first batch
        assert b.pop(False) is None
    else:  # out as soon as complete: at once
        assert b.pop(False) == (-1, [], [], False, True)
        assert b.pop(False) == (2, [0], [2], False, False)
    b.place(0)
    b.drop(1)  # all but one failed: not empty, only short
    got = [b.pop(True) for _ in range(3 if mode == "ordered" else 1)]
    expected = [(0, [0], [0], False, False)]
    if mode == "ordered":
        expected += [(-1, [], [], False, True), (2, [0], [2], False, False)]
    assert got == expected
    assert b.pop(True) is None


def test_regroup_drop_names_no_batch():
    b = Batcher("regroup", 2)
    assert b.drop(5) is None


def test_regroup_with_drop_last_drops_a_short_last_batch():
    b = Batcher("regroup", 3, drop_last=True)
    for p in range(5):  # six positions pulled, one skipped: the last batch would be short
        b.place(p)
    assert b.pop(False)[:4] == (0, [0, 1, 2], [0, 1, 2], False)
    assert b.pop(True).drop
    assert b.ready_samples == 0


def test_regroup_numbers_a_resumed_epochs_batches_past_those_it_delivered():
    b = Batcher("regroup", 2, first_key=12)  # 12 samples delivered before the resume
    assert b.place(30) == Place(12, 0, 2)
    b.place(31)
    assert b.pop(False).key == 12
    assert b.place(32).key == 13
