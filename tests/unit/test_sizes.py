"""Payload size accounting and type signatures (profiler/sizes.py)."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from collections import namedtuple

import numpy as np
import pytest
import torch
from PIL import Image

from headrace.profiler.sizes import (
    NUMBER_BYTES,
    payload_bytes,
    shape_signature,
    signatures,
    type_signature,
)

Sample = namedtuple("Sample", ["image", "label"])


@dataclasses.dataclass
class Boxed:
    pixels: np.ndarray
    name: str


class Opaque:
    def __init__(self) -> None:
        self.values = list(range(5))


def test_tensor_counts_elements_not_python_overhead():
    x = torch.zeros(3, 224, 224, dtype=torch.float32)
    assert payload_bytes(x) == 3 * 224 * 224 * 4
    assert payload_bytes(x.to(torch.uint8)) == 3 * 224 * 224
    assert payload_bytes(torch.zeros(10, dtype=torch.float64)) == 80


def test_tensor_view_counts_its_own_extent_not_the_storage():
    base = torch.zeros(1000, 1000)
    assert payload_bytes(base[:10]) == 10 * 1000 * 4
    assert payload_bytes(base[:, 0]) == 1000 * 4  # strided, non-contiguous
    assert payload_bytes(base[::10, ::10]) == 100 * 100 * 4
    assert payload_bytes(base.T) == payload_bytes(base)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_sparse_tensor_counts_values_and_indices():
    dense = torch.zeros(100, 100)
    dense[0, 0] = dense[5, 7] = 1.0
    sp = dense.to_sparse()
    assert payload_bytes(sp) == 2 * 4 + 2 * 2 * 8  # float32 values + int64 (2, nnz) indices
    csr = dense.to_sparse_csr()
    assert payload_bytes(csr) == 2 * 4 + 101 * 8 + 2 * 8


def test_numpy_arrays_views_and_scalars():
    a = np.zeros((224, 224, 3), dtype=np.uint8)
    assert payload_bytes(a) == 224 * 224 * 3
    assert payload_bytes(a[::2]) == 112 * 224 * 3
    assert payload_bytes(np.float32(1.5)) == 4
    assert payload_bytes(np.int64(3)) == 8
    obj = np.array([b"abc", np.zeros(4, dtype=np.int16)], dtype=object)
    assert payload_bytes(obj) == 3 + 8


def test_bytes_like_and_strings():
    assert payload_bytes(b"x" * 1000) == 1000
    assert payload_bytes(bytearray(17)) == 17
    assert payload_bytes(memoryview(np.zeros(10, dtype=np.float32))[2:5]) == 12
    assert payload_bytes("hello") == 5
    assert payload_bytes("héllo") == 6  # UTF-8: é is two bytes
    s = "a" * 10_000
    assert payload_bytes(s) == 10_000 != sys.getsizeof(s)


@pytest.mark.parametrize(
    ("mode", "per_pixel"),
    [("RGB", 3), ("RGBA", 4), ("L", 1), ("1", 1), ("P", 1), ("F", 4), ("I", 4), ("I;16", 2)],
)
def test_pil_image_is_width_height_bands_depth(mode, per_pixel):
    img = Image.new(mode, (20, 10))
    assert payload_bytes(img) == 20 * 10 * per_pixel


def test_pil_size_matches_its_numpy_form():
    img = Image.new("RGB", (31, 17))
    assert payload_bytes(img) == np.asarray(img).nbytes


def test_numbers_and_none():
    assert payload_bytes(3) == NUMBER_BYTES == 8
    assert payload_bytes(2.5) == 8
    assert payload_bytes(True) == 8
    assert payload_bytes(1 + 2j) == 16
    assert payload_bytes(None) == 0


def test_nested_containers_sum_their_leaves():
    img = torch.zeros(3, 8, 8)
    sample = {"image": img, "label": 7, "meta": {"id": "abc", "boxes": [np.zeros(4), None]}}
    assert payload_bytes(sample) == 3 * 8 * 8 * 4 + 8 + 3 + 4 * 8
    assert payload_bytes((img, 3)) == 3 * 8 * 8 * 4 + 8
    assert payload_bytes([img, img]) == 2 * 3 * 8 * 8 * 4
    assert payload_bytes({1, 2, 3}) == 24


def test_namedtuple_and_dataclass_sum_their_fields():
    assert payload_bytes(Sample(torch.zeros(4, 4), 1)) == 64 + 8
    assert payload_bytes(Boxed(np.zeros(10, dtype=np.uint8), "ab")) == 12


def test_long_number_lists_take_the_fast_path_with_the_same_answer():
    ids = list(range(10_000))
    assert payload_bytes(ids) == 8 * 10_000
    mixed = [*range(20), "abcd"]
    assert payload_bytes(mixed) == 20 * 8 + 4


def test_other_objects_fall_back_to_pickle_length():
    obj = Opaque()
    assert payload_bytes(obj) == len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    assert payload_bytes(lambda x: x) == 0  # unpicklable: no measurable payload


def test_deep_nesting_does_not_recurse_forever():
    x: list = []
    x.append(x)
    assert payload_bytes(x) == 0  # it holds nothing but itself, counted once


def test_type_signature_flags_type_rank_and_dtype_changes():
    raw = b"\xff\xd8jpeg"
    img = np.zeros((8, 8, 3), dtype=np.uint8)
    assert type_signature(raw) != type_signature(img)  # decode
    assert type_signature(img) == type_signature(img[:, ::-1])  # flip
    assert type_signature(img) == type_signature(img[:4, :2])  # crop: shape only
    # a cast: a barrier (a step measured after it kept its dtype only there)
    assert type_signature(img) != type_signature(img.astype(np.float32))
    t = torch.zeros(3, 4, dtype=torch.uint8)
    assert type_signature(t) != type_signature(t.float())
    assert type_signature(t.float()) == type_signature((t.float() - 128) / 64)  # normalize
    assert type_signature(img) != type_signature(img[..., 0])  # rank 3 -> 2
    assert type_signature(img) != type_signature(torch.from_numpy(img))  # numpy -> torch
    pil = Image.new("RGB", (8, 8))
    assert type_signature(pil) == type_signature(pil.transpose(Image.FLIP_LEFT_RIGHT))
    assert type_signature(pil) != type_signature(Image.new("L", (8, 8)))
    assert type_signature(Image.new("L", (8, 8))) != type_signature(Image.new("F", (8, 8)))
    assert type_signature(pil) != type_signature(torch.zeros(3, 8, 8))  # ToTensor


def test_type_signature_of_structures():
    t = torch.zeros(3, 4, 4)
    assert type_signature((t, 1)) == type_signature((t * 2, 5))
    assert type_signature((t, 1)) != type_signature((Image.new("RGB", (4, 4)), 1))
    assert type_signature({"x": t}) != type_signature({"x": t[0]})
    # a list's length does not matter, only the kinds of its items
    assert type_signature([t] * 9) == type_signature([t] * 3)
    hash(type_signature({"a": [t, (1, "s")], "b": None}))


@dataclasses.dataclass(eq=False)
class _Node:
    value: float
    parent: _Node | None = None
    children: list = dataclasses.field(default_factory=list)


def test_shape_signature_flags_dtype_and_shape_changes():
    # what AutoOrder's shape rule reads: a step keeps the sample's signature or changes it
    img = np.zeros((8, 6, 3), np.uint8)
    assert shape_signature(img) == shape_signature(img[::-1].copy())  # flip: kept
    assert shape_signature(img) != shape_signature(img.astype(np.float32))  # cast
    assert shape_signature(img) != shape_signature(img[:4])  # crop
    assert shape_signature(img) != shape_signature(img.transpose(1, 0, 2))  # 8x6 -> 6x8
    t = torch.zeros(3, 4)
    assert shape_signature(t) == shape_signature(t + 1) != shape_signature(t.double())
    pil = Image.new("RGB", (8, 6))
    assert shape_signature(pil) == shape_signature(pil.transpose(Image.FLIP_LEFT_RIGHT))
    assert shape_signature(pil) != shape_signature(pil.resize((4, 3)))
    assert shape_signature(pil) != shape_signature(pil.convert("L"))
    # structures: a label kept, boxes dropped by a crop, a longer text
    assert shape_signature((t, 1)) == shape_signature((t * 2, 5))
    assert shape_signature({"x": t, "boxes": [t[0]] * 3}) != shape_signature(
        {"x": t, "boxes": [t[0]] * 2})
    assert shape_signature("abc") != shape_signature("abcd")
    assert shape_signature([t] * 20) != shape_signature([t] * 19)
    hash(shape_signature({"a": [t, (1, "s")], "b": None, "c": (t,) * 12}))


def test_one_walk_gives_both_signatures():
    Point = namedtuple("Point", "x y")
    t, a = torch.zeros(3, 4), np.zeros((2, 5), np.float32)
    samples = [t, a, 3, 2.5, True, None, "txt", b"raw", np.float32(1.0), Image.new("RGB", (4, 4)),
               (t, 1), Point(t, a), [t, a, 1], [a] * 12, {"image": a, "label": 1, "m": {"k": [t]}},
               {i: i for i in range(9)}, (a,) * 9, ((t, (a, (1, 2))),), torch.nn.Parameter(t)]
    for x in samples:
        assert signatures(x) == (type_signature(x), shape_signature(x)), x


def test_a_graph_with_back_references_is_walked_once():
    # a tree whose nodes point at their parents: every back-reference walked the tree again,
    # down to depth 64, and a 40-node sample never finished measuring (the loader hung)
    root = _Node(0.0)
    nodes = [root]
    for i in range(1, 40):
        child = _Node(float(i), parent=nodes[(i - 1) // 2])
        nodes[(i - 1) // 2].children.append(child)
        nodes.append(child)
    assert payload_bytes(root) == 40 * NUMBER_BYTES  # each node's value once
    shared = [1.0, 2.0]
    assert payload_bytes({"a": shared, "b": shared}) == 2 * NUMBER_BYTES  # counted once


def test_a_value_the_profiler_cannot_read_is_measured_without_raising():
    # a nested tensor of the strided layout has no numel() nor shape: measuring a step's
    # output raised outside the step's own error handling (a worker died twice, or with
    # num_workers=0 an error named no sample and no step)
    from headrace.profiler.sizes import measure

    nt = torch.nested.nested_tensor([torch.arange(3.0), torch.arange(2.0)])
    size, sig, shape = measure(nt)
    assert size == 5 * 4 and sig == type_signature(nt)
    assert shape != measure(nt)[2]  # read as changing the shape: AutoOrder does not move it
