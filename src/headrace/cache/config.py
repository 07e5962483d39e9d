"""``headrace.Cache``: what a loader caches, where, and how much memory it may take."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

DEFAULT_MEMORY_SHARE = 0.25
"""The default budget is this share of the memory available when the loader starts..."""
DEFAULT_SHM_SHARE = 0.5
"""...and at most this share of the free space of ``/dev/shm``, where the memory backend lives."""


@dataclasses.dataclass(frozen=True)
class Cache:
    """Seneca's tiered cache of samples (encoded, decoded, augmented forms).

    Pass it as ``headrace.Options(cache=Cache(...))``; ``Options(cache=None)`` turns caching off.
    A hit skips exactly the steps its form covers and runs the rest with the same per-sample
    seeds, so a sample served from the cache is identical to one computed (see
    ``headrace.cache.tiers``).

    Attributes:
        url: ``"memory"`` (default): one job's cache in shared memory (an LMDB file on
            ``/dev/shm``), read in place by every worker process of the loader, removed when
            the loader closes.
        budget_bytes: the most bytes the cache holds (all tiers together), enforced by headrace.
            ``None``: ``DEFAULT_MEMORY_SHARE`` (25%) of the memory available when the loader
            starts, at most ``DEFAULT_SHM_SHARE`` (50%) of ``/dev/shm``'s free space. The memory
            is taken as samples are cached (epoch 1), not up front, and is page cache of a
            tmpfs file: it counts in the machine's shared memory, not in any process's RSS.
        shared_augmented: serve the augmented (final) form across epochs and jobs. Off by
            default: the final output of a random step is exact only for one (base seed,
            epoch), so it is keyed by both and never reused by another epoch. On, an
            augmented entry is served once, in place of computing the sample in a later
            epoch (or another job): the sample's content then depends on what another epoch or
            job drew (Seneca's trade; ``explain()`` says so).
        job: a name for this job in a cache shared by several jobs (Redis).
        split: bytes share per tier, e.g. ``{"decoded": 0.8, "encoded": 0.2}``; ``None``:
            the whole budget to the most processed exact form (decoded, else encoded) until
            the MDP model (``planner/cache_partition.py``) has measurements to split it.
    """

    url: str = "memory"
    budget_bytes: int | None = None
    shared_augmented: bool = False
    job: str | None = None
    split: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        if self.url != "memory" and not self.url.startswith("redis://"):
            raise ValueError(f"Cache url must be 'memory' or 'redis://host:port/db', got {self.url!r}")
        if self.budget_bytes is not None and self.budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0 (or None for the default)")
        if self.split is not None:
            bad = set(self.split) - {"encoded", "decoded", "augmented"}
            if bad or any(v < 0 for v in self.split.values()) or sum(self.split.values()) > 1 + 1e-9:
                raise ValueError("split maps 'encoded'/'decoded'/'augmented' to shares >= 0 "
                                 f"summing to at most 1, got {dict(self.split)}")


def default_budget_bytes() -> int:
    """The default budget (see ``Cache.budget_bytes``), in bytes."""
    import psutil

    avail = psutil.virtual_memory().available * DEFAULT_MEMORY_SHARE
    try:
        st = os.statvfs("/dev/shm")
        avail = min(avail, st.f_bavail * st.f_frsize * DEFAULT_SHM_SHARE)
    except OSError:
        pass
    return int(avail)
