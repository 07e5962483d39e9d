"""Stand-ins for CUDA in CPU tests: events the test completes, pinned memory that is plain
memory. They implement ``runtime/pinning.py``'s ``Fence`` and ``HostMemory``; the CUDA ones are
exercised by tests/gpu when a GPU is present."""

from __future__ import annotations

import numpy as np


class FakeFence:
    """A device event that completes when the test says so."""

    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


class FakePinned:
    """Stands for page-locked memory: records allocations and the fence of every release."""

    pinned = True

    def __init__(self) -> None:
        self.allocations: list[int] = []
        self.fences: list[FakeFence] = []

    def allocate(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes, dtype=np.uint8)
        self.allocations.append(raw.ctypes.data)
        return raw

    def release_fence(self) -> FakeFence:
        f = FakeFence()
        self.fences.append(f)
        return f

    def set_idle(self, raw: np.ndarray, idle: bool) -> None:
        """Pinned memory is inherited by forked processes, as any NumPy memory."""
