from headrace.runtime.batcher import Batcher


def test_regroup_fills_fast_first_then_slow_and_flushes_tail():
    b = Batcher("regroup", 3)
    b.complete(0, "s0", slow=True)
    b.complete(1, "f1")
    assert b.pop(final=False) is None
    b.complete(2, "f2")
    b.complete(3, "f3")
    batch = b.pop(final=False)
    assert [p for p, _ in batch] == [1, 2, 3]
    assert b.pop(final=False) is None  # one slow sample left, batch not full
    assert [p for p, _ in b.pop(final=True)] == [0]
    assert b.pop(final=True) is None


def test_ordered_yields_groups_in_sampler_order():
    b = Batcher("ordered", 2)
    b.add_group(0, [0, 1])
    b.add_group(2, [2, 3])
    b.complete(3, "c")
    b.complete(2, "b")
    assert b.pop(False) is None  # group 0 not complete
    b.complete(1, "y")
    b.complete(0, "x")
    assert b.pop(False) == [(0, "x"), (1, "y")]
    assert b.pop(False) == [(2, "b"), (3, "c")]


def test_grouped_yields_complete_groups_first_and_keeps_membership():
    b = Batcher("grouped", None)
    b.add_group(0, [0, 1])
    b.add_group(2, [2, 3])
    b.complete(2, "b")
    b.complete(3, "c")
    assert b.pop(False) == [(2, "b"), (3, "c")]
    b.complete(0, "x")
    b.drop(1)
    assert b.pop(False) == [(0, "x")]
    assert b.ready_samples == 0


def test_a_group_whose_samples_were_all_skipped_is_not_yielded():
    b = Batcher("ordered", 1)
    b.add_group(0, [0])
    b.add_group(1, [1])
    b.drop(0)
    b.complete(1, "z")
    assert b.pop(False) == [(1, "z")]
