"""Which partial values a hand-off would not carry as they are (``runtime/faithful.py``)."""

import collections
import threading

import numpy as np
import torch

from headrace.runtime.faithful import why_it_stays
from tests.helpers import Twice

Point = collections.namedtuple("Point", "x y")


def test_parts_sharing_memory_stay():
    t, a = torch.ones(8, 8), np.ones((8, 8))
    assert "same Tensor" in why_it_stays({"img": t, "same": t})
    assert "share memory" in why_it_stays({"img": t, "top": t[:2]})
    assert "share memory" in why_it_stays([a, a[:, 1]])
    assert "share memory" in why_it_stays((a, torch.from_numpy(a)))  # across NumPy and torch
    shared = [1]
    assert "same list" in why_it_stays({"a": shared, "b": shared})
    d: dict = {}
    d["self"] = d  # the transport's walk would never end
    assert "same dict" in why_it_stays(d)


def test_values_that_do_not_pickle_or_cross_processes_stay():
    assert "does not pickle" in why_it_stays({"lock": threading.Lock()})
    grad = torch.ones(2, requires_grad=True) * 2
    assert "does not pickle" in why_it_stays(grad)


def test_separate_parts_and_immutable_repeats_travel():
    t = torch.ones(8, 8)
    label = "cat"
    assert why_it_stays({"img": t, "top": t[:2].clone(), "arr": np.zeros(3), "n": 3,
                         "names": (label, label), "p": Point(1, 2), "empty": [torch.empty(0), torch.empty(0)],
                         "leaf": torch.ones(2, requires_grad=True), "raw": b"x"}) is None


def test_a_named_tuple_its_class_does_not_rebuild_from_its_fields_stays():
    # it pickles (the check dumps only): the transport rebuilds named tuples from their
    # fields, which raised, and the handed-off sample failed where torch delivered it
    why = why_it_stays({"pair": Twice(3.0)})
    assert why is not None and "value['pair'] is a named tuple (Twice)" in why, why
    assert why_it_stays({"p": Point(1, 2)}) is None
