"""AutoOrder's premise checked per sample (``pipeline/order_guard.py``), without processes."""

from __future__ import annotations

import numpy as np

from headrace.pipeline import Pipeline, step
from headrace.pipeline.order_guard import OrderGuard, swapped_pairs
from headrace.pipeline.runner import SampleRunner
from headrace.profiler.sizes import shape_signature


def test_swapped_pairs_are_the_pairs_whose_relative_order_changed():
    assert swapped_pairs([0, 1, 2, 3], [0, 1, 2, 3]) == []
    assert swapped_pairs([0, 1, 2, 3], [0, 2, 1, 3]) == [(1, 2)]
    # 3 moved to the front of the steps: it crossed both
    assert swapped_pairs([0, 1, 2, 3], [0, 3, 1, 2]) == [(1, 2), (1, 3)]
    assert swapped_pairs([0, 1, 2], [0, 2, 1]) == [(1, 2)]


class Rows:
    def __len__(self) -> int:
        return 8

    def load(self, i: int) -> np.ndarray:
        return np.full((64 if i % 2 else 8, 4), i, dtype=np.float32)


def pad_to_32(x, rng):  # keeps 64 rows, pads 8 or 16 to 32
    if x.shape[0] >= 32:
        return x
    return np.concatenate([x, np.full((32 - x.shape[0], x.shape[1]), rng.random(), x.dtype)])


def crop_16(x, rng):
    top = int(rng.integers(0, max(1, x.shape[0] - 16 + 1)))
    return x[top:top + 16].copy()


def flip(x, rng):
    return x[::-1].copy() if rng.random() < 0.5 else x


def test_a_sample_that_breaks_the_premise_is_run_in_the_declared_order():
    pad, crop, fl = (step(f, random=True) for f in (pad_to_32, crop_16, flip))
    declared = Pipeline(Rows(), [pad, fl, crop])
    # what AutoOrder would run from 64-row samples: the pad and the flip kept their shape
    moved = declared.with_steps([crop, fl, pad], kept_shape=declared.keys[1:3])
    assert declared.declared is None and moved.declared == (pad, fl, crop)
    assert declared.with_steps([pad, fl, crop]).declared is None
    seen: list[int] = []
    guard = OrderGuard.of(moved, shape_signature, seen.append)
    assert guard is not None and OrderGuard.of(declared, shape_signature) is None
    assert guard.watched == guard.keep == {2, 3} and guard.to_executed == [0, 3, 2, 1]
    plain, guarded, wanted = SampleRunner(moved), SampleRunner(moved, guard=guard), \
        SampleRunner(declared)
    for i in range(8):
        want = wanted.run(i, 0, None, base_seed=3, epoch=1)
        got = guarded.run(i, 0, None, base_seed=3, epoch=1)
        unguarded = plain.run(i, 0, None, base_seed=3, epoch=1).value
        np.testing.assert_array_equal(got.value, want.value)
        # the declared order's outcome, its steps given as the executed order's positions
        assert sorted(t.step for t in got.timings) == [0, 1, 2, 3]
        if i % 2:  # 64 rows: the pad kept them declared, but pads the crop's 16 when moved
            assert unguarded.shape == (32, 4) and got.value.shape == (16, 4)
        else:  # 8 rows: the crop keeps them, the pad changes them when moved too
            assert unguarded.shape == (32, 4) and got.value.shape == (16, 4)
    assert seen == [3]  # told once: the pad (executed position 3)
    assert "pad_to_32 changed a sample's dtype or shape after it was moved across " \
           "crop_16, flip" in guard.says(3)


def test_an_order_whose_moved_steps_keep_the_shape_runs_as_chosen():
    # a flip moved across a crop keeps the shape on every sample: nothing runs twice
    fl, crop = step(flip, random=True), step(crop_16, random=True)
    moved = Pipeline(Rows(), [fl, crop]).with_steps([crop, fl])
    seen: list[int] = []
    guarded = SampleRunner(moved, guard=OrderGuard.of(moved, shape_signature, seen.append))
    plain = SampleRunner(moved)
    for i in range(8):
        a, b = guarded.run(i, 0, None, base_seed=3, epoch=1), plain.run(i, 0, None, 3, 1)
        np.testing.assert_array_equal(a.value, b.value)
        assert [t.step for t in a.timings] == [0, 1, 2]
    assert seen == []


def test_without_the_profile_one_of_two_steps_that_swapped_must_keep_the_shape():
    # an order restored from a state dict without a profile: which step kept the shape is not
    # known, so a sample on which both changed it is run in the declared order
    pad, crop = step(pad_to_32, random=True), step(crop_16, random=True)
    declared = Pipeline(Rows(), [pad, crop])
    moved = declared.with_steps([crop, pad])
    guard = OrderGuard.of(moved, shape_signature)
    assert guard is not None and guard.keep == set() and guard.either == {2: (1,)}
    guarded, wanted = SampleRunner(moved, guard=guard), SampleRunner(declared)
    for i in (1, 3, 5):  # 64 rows: the crop and the moved pad both change them
        got = guarded.run(i, 0, None, base_seed=3, epoch=1)
        np.testing.assert_array_equal(got.value, wanted.run(i, 0, None, 3, 1).value)
    assert guard.broken == 2


def test_an_error_in_the_declared_run_says_that_the_sample_ran_in_the_declared_order():
    # the failing step's input (64 rows) cannot come from the executed order (crop first):
    # the error says why the sample ran in the declared one
    def pad_picky(x, rng):
        if x.shape[0] == 64 and x[0, 0] == 7:
            raise ValueError("no 64-row sample 7")
        return pad_to_32(x, rng)

    pad, crop = step(pad_picky, random=True), step(crop_16, random=True)
    declared = Pipeline(Rows(), [pad, crop])
    moved = declared.with_steps([crop, pad], kept_shape=declared.keys[1:2])
    out = SampleRunner(moved, guard=OrderGuard.of(moved, shape_signature)).run(7, 0, None, 3, 1)
    assert out.error is not None and out.error[0] == 2  # pad_picky's executed position
    assert "no 64-row sample 7" in out.error[2]
    assert "ran again in the declared step order" in out.error[2]


def test_the_declared_run_starts_from_and_adds_to_the_python_draw_flags():
    import random

    calls = []

    class Drawing(Rows):
        def load(self, i):
            calls.append(i)
            return super().load(i) + np.float32(random.random())

    pad, crop = step(pad_to_32, random=True), step(crop_16, random=True)
    declared = Pipeline(Drawing(), [pad, crop])
    moved = declared.with_steps([crop, pad], kept_shape=declared.keys[1:2])
    learned: list[int] = []
    runner = SampleRunner(moved, guard=OrderGuard.of(moved, shape_signature),
                          on_python_draw=learned.append)
    runner.run(1, 0, None, 3, 1)  # load drew unseeded: again; the pad broke it: declared
    assert calls == [1, 1, 1] and learned == [0] and runner.python_draws[0]
    calls.clear()
    runner.run(3, 0, None, 3, 1)  # both know load draws: one run each
    assert calls == [3, 3]
