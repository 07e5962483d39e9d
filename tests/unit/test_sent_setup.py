"""A spawned worker's setup as it arrives (``runtime/sent_setup.py``): the pickled bytes are
let go of once unpickled, so that a worker does not hold its dataset twice for its life."""

from __future__ import annotations

import gc
import os
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest

from headrace.runtime.sent_setup import ReceivedSetup, SentSetup
from headrace.runtime.worker import WorkerSetup

PAYLOAD = 1 << 20
"""Bytes of the dataset sent (1 MiB): larger than anything else the setup pickles into."""


def bytes_held(obj: Any, depth: int = 3) -> int:
    """Total length of the ``bytes`` objects reachable from ``obj`` within ``depth`` references."""
    seen, total, level = {id(obj)}, 0, [obj]
    for _ in range(depth):
        nxt = []
        for o in level:
            for r in gc.get_referents(o):
                if id(r) in seen or isinstance(r, type):
                    continue
                seen.add(id(r))
                if isinstance(r, bytes):
                    total += len(r)
                nxt.append(r)
        level = nxt
    return total


def received(dataset: Any) -> ReceivedSetup:
    setup = WorkerSetup(slot=3, num_workers=4, base_seed=0, pipeline=None, dataset=dataset,
                        worker_init_fn=None, parent_pid=os.getpid(), profile=False)
    got = pickle.loads(ForkingPickler.dumps(SentSetup(setup, ("handoff", None), "spawn")))
    assert isinstance(got, ReceivedSetup)
    return got


def test_load_lets_go_of_the_pickled_bytes():
    got = received(bytearray(PAYLOAD))
    assert (got.slot, got.parent_pid, got.method) == (3, os.getpid(), "spawn")
    assert bytes_held(got) > PAYLOAD  # as it arrives: the setup pickled
    setup, shared = got.load()
    assert setup.dataset == bytearray(PAYLOAD) and shared == ("handoff", None)
    # the worker's Process keeps its arguments (this object) for its life: held there, the
    # bytes cost a spawned worker the dataset's size again (200 MiB: USS 550 MiB, not 351)
    assert bytes_held(got) < PAYLOAD


def test_a_second_load_says_the_setup_was_taken():
    got = received(b"x")
    got.load()
    with pytest.raises(RuntimeError, match="already unpickled"):
        got.load()
