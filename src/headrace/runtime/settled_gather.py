"""A gather of every rank's object whose tensors no thread of the process group holds when it
returns (``torch.distributed`` with gloo).

A gloo worker thread drops its references to a collective's tensors a few milliseconds after
the collective has completed, and for a tensor that has a Python object that drop takes the GIL.
A script that ends right after a checkpoint (Accelerate's ``save_state`` gathers the loaders'
states last; Lightning's DDP checkpoint, ``runtime/ranks.py``) could have a worker held up by a
loaded machine come for the GIL after the interpreter had begun finalizing: CPython ended the
thread (``pthread_exit``), the unwinding met a ``noexcept`` destructor, and the rank aborted at
exit ("terminate called without an active exception", exit -6; core dumps of the README's
Accelerate snippet, about 2 in 10 full test runs). ``all_gather_object``'s tensors are its own;
here they are ours, held until no other thread holds them.
"""

from __future__ import annotations

import pickle
import sys
import time
from typing import Any

import torch

SETTLE_S = 1.0
"""Seconds :func:`all_gather_settled` waits at most for the process group's threads to drop
its tensors (within a few milliseconds of the collective's end on a loaded 2-core machine)."""


def all_gather_settled(obj: Any, world: int) -> list[Any]:
    """Every rank's ``obj``, in rank order (as ``torch.distributed.all_gather_object``; on the
    CPU: gloo), returned once the process group's own threads have dropped the tensors that
    carried it, or after :data:`SETTLE_S`."""
    payload = pickle.dumps(obj)
    sizes = _all_gather_bytes(len(payload).to_bytes(8, "little"), 8, world)
    longest = max(int.from_bytes(b, "little") for b in sizes)
    data = _all_gather_bytes(payload, longest, world)
    return [pickle.loads(d[:int.from_bytes(n, "little")])  # noqa: S301 - the ranks' own states
            for d, n in zip(data, sizes, strict=True)]


def _all_gather_bytes(payload: bytes, length: int, world: int) -> list[bytes]:
    """Every rank's ``payload`` padded to ``length`` bytes.

    While C++ code holds a tensor, torch holds a reference to the tensor's Python object too,
    and drops it, under the GIL, when C++ drops its last: the Python reference counts back at
    what they were before the collective mean that no thread will take the GIL for these
    tensors again (a torch that keeps no such reference needs no GIL to drop one)."""
    mine = torch.zeros(length, dtype=torch.uint8)
    if payload:
        mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    outputs = [torch.empty(length, dtype=torch.uint8) for _ in range(world)]
    tensors = [mine, *outputs]
    before = [sys.getrefcount(t) for t in tensors]
    torch.distributed.all_gather(outputs, mine)
    deadline = time.monotonic() + SETTLE_S
    while [sys.getrefcount(t) for t in tensors] != before and time.monotonic() < deadline:
        time.sleep(0.001)
    return [o.numpy().tobytes() for o in outputs]
