"""A node's worker and memory budget, shared by the data-parallel ranks running on it (pure).

Under ``torchrun`` (or ``accelerate launch``) one training process per accelerator runs on each
node, and each has its own loader. Left alone, each loader of ``num_workers="auto"`` would size
itself for the whole node: with 8 ranks, 8 × the cores in workers and 8 × half the memory.
Each rank takes ``1 / LOCAL_WORLD_SIZE`` of both instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def local_world_size(env: Mapping[str, str] | None = None) -> int:
    """Training processes of this job on this node: ``LOCAL_WORLD_SIZE`` (set by ``torchrun``
    and ``accelerate launch``), else 1. Launchers that do not set it (Lightning's own, a
    hand-written ``mp.spawn``) leave each rank the whole node unless the script sets it."""
    raw = (os.environ if env is None else env).get("LOCAL_WORLD_SIZE", "")
    try:
        return max(1, int(raw))
    except ValueError:
        return 1


def cpu_share(cores: int, local_ranks: int) -> int:
    """Cores one rank may plan its workers for: an equal share of ``cores``, at least 1."""
    return max(1, cores // max(1, local_ranks))


def memory_share(available_bytes: float, local_ranks: int) -> float:
    """Bytes of worker memory one rank may use: an equal share of ``available_bytes``."""
    return available_bytes / max(1, local_ranks)
