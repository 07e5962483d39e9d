"""``remote/payload.py``: what a remote worker's sample looks like once unpacked (no Ray)."""

import numpy as np
import pytest
import torch

from headrace.remote.payload import pack, unpack


def read_only(a: np.ndarray) -> np.ndarray:
    """``a`` as Ray's object store hands it over: a read-only view."""
    v = a.view()
    v.setflags(write=False)
    return v


@pytest.mark.timeout(30)
def test_unpacked_arrays_are_writable_with_their_layout():
    fortran = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    sample = {"img": read_only(fortran), "list": [read_only(np.ones(3))],
              "t": pack(torch.arange(4))}
    out = unpack(sample)
    for a in (out["img"], out["list"][0], out["t"].numpy()):
        a += 1  # in place, as a collate_fn may: raised "assignment destination is read-only"
    assert np.array_equal(out["img"], fortran + 1) and out["img"].flags.f_contiguous
    assert np.array_equal(out["list"][0], np.full(3, 2.0))
    assert torch.equal(out["t"], torch.arange(1, 5))


@pytest.mark.timeout(30)
def test_writable_arrays_are_not_copied():
    a = np.zeros(3)
    assert unpack({"a": a})["a"] is a
