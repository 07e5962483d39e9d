"""Batches assembled in place must equal torch's default_collate, leaf for leaf."""

import multiprocessing as mp
from collections import namedtuple

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from torch.utils.data._utils import collate as torch_collate

from headrace.runtime.assembly import BatchAssembly, stacks_in_place
from headrace.runtime.ring import Ring, RingRef, RingWriter
from headrace.runtime.ring import encode as ring_encode

Pair = namedtuple("Pair", "image label")


def assert_same(got, want, where="batch"):
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert got.is_contiguous(), where
        assert torch.equal(got, want), where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def sample(i):
    """A sample with every kind of leaf and container default_collate handles."""
    rng = np.random.default_rng(i)
    return {
        "image": torch.from_numpy(rng.random((3, 32, 32), dtype=np.float32)),  # ringed (12 KB)
        "mask": rng.integers(0, 255, (40, 40), dtype=np.uint8),  # NumPy, ringed
        "small": np.array([i, i + 1], dtype=np.int16),  # inline NumPy
        "scalar": np.float32(i / 3),  # NumPy scalar: an object leaf
        "zero_d": np.array(i, dtype=np.int64),  # 0-d array
        "label": i,
        "weight": i / 7,
        "flag": i % 2 == 0,
        "name": f"s{i}",
        "pair": Pair(torch.full((2,), float(i)), i * 10),
        "as_tuple": (torch.tensor([i]), "t"),
        "as_list": [np.full(3, i, dtype=np.float64)],
    }


def assemble(samples, rows=None, capacity=None, ring_size=1 << 20, collate=default_collate):
    ring = Ring(mp.get_context("fork"), size=ring_size)
    writer = RingWriter(ring, parent_pid=0)
    capacity = capacity or len(samples)
    rows = rows if rows is not None else list(range(len(samples)))
    batch = BatchAssembly(capacity, collate, auto_collation=True)
    for row, (i, s) in zip(rows, enumerate(samples), strict=True):
        value = ring_encode(s, writer)
        batch.put(row, i, value, ring)
        ring.read_pos.value = writer.write_pos  # freed at once, as the scheduler does
    return batch


def test_in_place_batch_equals_default_collate_for_every_leaf_kind():
    samples = [sample(i) for i in range(5)]
    batch = assemble(samples)
    assert batch.in_place
    assert_same(batch.finish(list(range(5))), default_collate(samples))


def test_rows_are_copied_out_of_the_ring_before_it_is_reused():
    samples = [sample(i) for i in range(4)]
    # a ring that holds about one sample: every put overwrites the previous one's bytes
    batch = assemble(samples, ring_size=24 * 1024)
    assert_same(batch.finish([0, 1, 2, 3]), default_collate(samples))


def test_a_short_last_batch_and_a_skipped_row_give_the_rows_present():
    samples = [sample(i) for i in range(3)]
    short = assemble(samples, capacity=8)
    assert_same(short.finish([0, 1, 2]), default_collate(samples))
    holed = assemble(samples, rows=[0, 2, 3], capacity=4)  # row 1 was skipped
    assert_same(holed.finish([0, 2, 3]), default_collate(samples))


def test_rows_arriving_out_of_order_land_in_their_rows():
    samples = [sample(i) for i in range(4)]
    batch = assemble(list(reversed(samples)), rows=[3, 2, 1, 0])
    assert_same(batch.finish([0, 1, 2, 3]), default_collate(samples))
    assert batch.indices == {3: 0, 2: 1, 1: 2, 0: 3}


def test_plain_tensors_tuples_and_namedtuples_as_whole_samples():
    tensors = [torch.arange(6.0).reshape(2, 3) + i for i in range(3)]
    assert_same(assemble(tensors).finish([0, 1, 2]), default_collate(tensors))
    tuples = [(torch.ones(2) * i, i) for i in range(3)]
    assert_same(assemble(tuples).finish([0, 1, 2]), default_collate(tuples))
    pairs = [Pair(np.ones(3, dtype=np.float32) * i, i) for i in range(3)]
    assert_same(assemble(pairs).finish([0, 1, 2]), default_collate(pairs))
    numbers = [1.5, 2.5]
    assert_same(assemble(numbers).finish([0, 1]), default_collate(numbers))


def test_empty_tensors_get_the_strides_default_collate_gives():
    # NumPy gives an empty array strides of 0 ((4, 0, 3): (0, 0, 0)); torch.stack (3, 3, 1)
    samples = [torch.zeros(0, 3) for _ in range(4)]
    got, want = assemble(samples).finish([0, 1, 2, 3]), default_collate(samples)
    assert_same(got, want)
    assert got.stride() == want.stride()


def test_a_sample_of_another_shape_falls_back_and_raises_torchs_error():
    samples = [{"x": torch.ones(3, 4)}, {"x": torch.ones(3, 4)}, {"x": torch.ones(5, 4)}]
    batch = assemble(samples)
    assert not batch.in_place
    with pytest.raises(RuntimeError) as got:
        batch.finish([0, 1, 2])
    with pytest.raises(RuntimeError) as want:
        default_collate(samples)
    assert str(got.value) == str(want.value)


def test_a_sample_of_another_structure_or_dtype_falls_back_to_torchs_result():
    mixed_dtype = [{"x": torch.ones(4)}, {"x": torch.ones(4, dtype=torch.float64)}]
    batch = assemble(mixed_dtype)
    assert not batch.in_place
    assert_same(batch.finish([0, 1]), default_collate(mixed_dtype))
    extra_key = [{"x": np.ones(2)}, {"x": np.ones(2), "y": 1}]  # torch ignores keys beyond the first's
    batch = assemble(extra_key)
    assert not batch.in_place
    assert_same(batch.finish([0, 1]), default_collate(extra_key))


def test_a_user_collate_fn_gets_the_decoded_samples_in_row_order():
    seen = []

    def collate(samples):
        seen.append(samples)
        return len(samples)

    samples = [{"x": np.full(2048, i, dtype=np.float32)} for i in range(3)]
    batch = assemble(samples, rows=[2, 0, 1], collate=collate)
    assert not batch.in_place
    assert batch.finish([0, 1, 2]) == 3
    assert [int(s["x"][0]) for s in seen[0]] == [1, 2, 0]
    assert not any(isinstance(s["x"], RingRef) for s in seen[0])


def test_in_place_only_for_torchs_unmodified_default_collate(monkeypatch):
    assert stacks_in_place(default_collate, auto_collation=True)
    assert not stacks_in_place(default_collate, auto_collation=False)
    assert not stacks_in_place(lambda b: default_collate(b), auto_collation=True)
    monkeypatch.setitem(torch_collate.default_collate_fn_map, torch.Tensor, lambda b, **_: "custom")
    assert not stacks_in_place(default_collate, auto_collation=True)


def test_falling_back_rebuilds_the_rows_already_stored_as_the_samples_they_were():
    seen = []
    samples = [(np.full(1500, i, dtype=np.float32), Pair(torch.ones(3) * i, "a"), [i]) for i in range(3)]
    samples.append((np.zeros(7, dtype=np.float32), Pair(torch.ones(3), "b"), [3]))  # another shape
    batch = assemble(samples)
    assert not batch.in_place
    batch.collate = lambda rows: seen.extend(rows) or "collated"
    assert batch.finish([0, 1, 2, 3]) == "collated"
    for got, want in zip(seen, samples, strict=True):
        assert type(got) is tuple and type(got[1]) is Pair and type(got[2]) is list
        assert np.array_equal(got[0], want[0]) and torch.equal(got[1].image, want[1].image)
        assert got[1].label == want[1].label and got[2] == want[2]


def test_the_samples_of_rows_stored_in_place_are_rebuilt_for_an_error_to_compare():
    # a collation error names the sample that differs from the first (runtime/work.py); the
    # rows stored in place are rebuilt for it, around views of the batch's tensors
    samples = [sample(i) for i in range(3)]
    samples[2]["label"] = None  # an object leaf: the batch stays in place
    batch = assemble(samples)
    assert batch.in_place
    got = batch.samples([0, 2])
    assert got[1]["label"] is None and got[0]["label"] == 0
    assert type(got[0]["pair"]) is Pair and type(got[0]["as_tuple"]) is tuple
    assert torch.equal(got[1]["image"], samples[2]["image"])
    assert np.array_equal(got[0]["mask"], samples[0]["mask"])
    assert batch.in_place  # nothing moved: the batch still collates in place


def test_arrays_with_negative_strides_fail_to_collate_as_default_collate_does():
    # torch.as_tensor refuses them; in place, the batch copied them without a word
    samples = [np.arange(5)[::-1] for _ in range(2)]
    with pytest.raises(ValueError, match="negative"):
        default_collate(samples)
    batch = BatchAssembly(2, default_collate, auto_collation=True)
    for row, s in enumerate(samples):
        batch.put(row, row, s, None)  # a worker thread's sample, as it was made
    with pytest.raises(ValueError, match="negative"):
        batch.finish([0, 1])
