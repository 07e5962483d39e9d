"""``headrace.Cache``: what a loader caches, where, and how much memory it may take."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from headrace import resources

DEFAULT_MEMORY_SHARE = 0.25
"""The default budget is this share of the memory available when the loader starts..."""
DEFAULT_SHM_SHARE = 0.5
"""...and at most this share of the free space of ``/dev/shm``, where the memory backend lives."""
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""URL schemes of a Redis cache, as redis-py's ``Redis.from_url`` reads them: TCP, TLS (which
managed services often require) and a unix socket (``unix:///path/redis.sock?db=0``)."""
MIN_DEFAULT_BUDGET = 256 * 10**6
"""The default cache is on only when its budget reaches this (bytes). Below it (Docker's 64 MB
``/dev/shm``, a small memory cgroup) a cache holds a few batches' worth and takes the shared
memory that torch's own loaders in the same job need for theirs (a compatibility sweep: a torch
validation loader beside a headrace one ran out of ``/dev/shm`` in 8 of 9 runs)."""


@dataclasses.dataclass(frozen=True)
class Cache:
    """Seneca's tiered cache of samples (encoded, decoded, augmented forms).

    Pass it as ``headrace.Options(cache=Cache(...))``; ``Options(cache=None)`` (or ``False``)
    turns caching off.
    A hit skips exactly the steps its form covers and runs the rest with the same per-sample
    seeds, so a sample served from the cache is identical to one computed (see
    ``headrace.cache.tiers``).

    Attributes:
        url: ``"memory"`` (default): one job's cache in shared memory (an LMDB file on
            ``/dev/shm``), read in place by every worker process of the loader, removed when
            the loader closes. ``"redis://[[user]:password@]host:port/db"`` (or ``rediss://``
            for TLS, ``unix:///path/redis.sock?db=0``): a Redis server shared by jobs and
            nodes. headrace prints it with its password replaced by ``***`` (``repr``,
            ``explain()``, logs).
        budget_bytes: the most bytes the cache holds (all tiers together), enforced by headrace.
            ``None``: ``DEFAULT_MEMORY_SHARE`` (25%) of the memory available when the loader
            starts (within the process's memory cgroup limit: a container's), at most
            ``DEFAULT_SHM_SHARE`` (50%) of ``/dev/shm``'s free space; under
            ``MIN_DEFAULT_BUDGET`` (256 MB) the default cache is off (``explain()`` says why).
            The memory is taken as samples are cached (epoch 1), not up front, and is page
            cache of a tmpfs file: it counts in the machine's shared memory and in the memory
            cgroup, not in any process's RSS. A Redis cache's budget is at most what the
            server has room for (``redis_limits``: 70% of its ``maxmemory`` left beside other
            data, read when the loader opens); the default is that much, and the local default
            only for a server without a ``maxmemory``. ``0``: nothing is cached
            (``explain()`` says so).
        shared_augmented: serve the augmented (final) form across epochs and jobs. Off by
            default: the final output of a random step is exact only for one (base seed,
            epoch), so it is keyed by both and never reused by another epoch. On, an
            augmented entry is served once, in place of computing the sample in a later
            epoch (or another job): the sample's content then depends on what another epoch or
            job drew (Seneca's trade; ``explain()`` says so).
        job: this job's name in a Redis cache shared by several jobs (ODS's registration
            and seen bits, each under the name and a token drawn per loader, so two live
            loaders given one name count as two jobs, and a warning says so). ``None``: a
            fresh name per loader (host, pid, random suffix). A restarted job may reuse its
            name or take a new one: a resumed epoch rewrites its seen bits from its state
            dict; the dead process still counts among the live jobs until ``ods_ttl_s`` has
            passed (and a restart within it is warned as a second live loader).
        split: bytes share per tier, e.g. ``{"decoded": 0.8, "encoded": 0.2}``; ``None``:
            the whole budget to the most processed exact form (decoded, else encoded) until
            the MDP model (``planner/cache_partition.py``) has measurements to split it.
        ods: Seneca's opportunistic data sampling (§5.2) for jobs sharing a Redis cache
            (``url="redis://..."``; off by default). When the sampler asks for a sample the
            shared cache does not hold, the job receives a cached sample it has not yet seen
            this epoch instead; the missed one stays unseen and comes later. Each job still
            gets every sample exactly once per epoch (and a mid-epoch ``state_dict()`` resumes
            exactly: it records delivered samples, not positions), but *which* sample fills a
            position, and so batch composition, then depends on what the other jobs cached.
            An entry is evicted once every live job used it (the job that stored it counts;
            an exact form only while its tier is full), freeing its bytes for the next sample
            a job computes (the jobs' samplers' random order makes that a pseudo-random
            refill). Needs torch's ``RandomSampler`` (without replacement) or
            ``SequentialSampler`` over the whole dataset and no dropped tail
            (a ``DistributedSampler`` shard would receive other ranks' samples); otherwise it
            stays off and ``explain()`` says why. With ``shared_augmented`` the augmented
            samples other jobs made are served too (Seneca's trade: content then depends on
            other jobs). Numbers per epoch: ``stats().last.cache.substituted`` and ``.jobs``.
        t_gpu: the accelerator's ingestion rate in samples per second, MDP's T_GPU (e.g.
            ``headrace.profiler.probe.probe(...).gthp`` times the batch size). ``None``:
            measured on the training loop, samples per second of its own time (outside
            ``next()``) in the last finished epoch; before one finished, no limit.
        b_cache: the cache's bandwidth to this process in bytes per second, MDP's B_cache.
            ``None``: measured once, when MDP first plans, on the backend in use: a timed
            32 MiB copy for ``"memory"``; for Redis, ``GET``s of a value the size of the
            largest cached form (4 KiB to 8 MiB) written under ``hr:bandwidth-probe:`` and
            deleted after (``cache/bandwidth.py``). Give it where one probe misleads: a link
            shared with other traffic, a server that will be farther than it is now.
        redis_ttl_s: (Redis) seconds an entry, and its namespace's share of the budget, outlive
            the last insert or hit of that namespace (6 hours by default). Entries of a changed
            pipeline (another prefix fingerprint) or of a dataset no job reads any more then
            leave the server and stop holding the budget; a live job's entries are hit every
            epoch, which keeps them (an epoch longer than this loses entries not hit since).
        ods_ttl_s: seconds a job's ODS state (its registration in the group's live jobs and
            its seen bits) outlives its last request to the server. A live job refreshes it
            with every sampler batch; a killed job stops counting among the live jobs (whose
            number is the eviction threshold) this long after it died.
    """

    url: str = "memory"
    budget_bytes: int | None = None
    shared_augmented: bool = False
    job: str | None = None
    split: Mapping[str, float] | None = None
    ods: bool = False
    ods_ttl_s: float = 60.0
    t_gpu: float | None = None
    redis_ttl_s: float = 6 * 3600.0
    b_cache: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str):  # is_redis would fail on it, naming no field
            raise TypeError("Cache(url=...) takes a string: 'memory' or 'redis://host:port/db', "
                            f"got {self.url!r} of type {type(self.url).__qualname__}")
        if self.url != "memory" and not is_redis(self.url):
            raise ValueError("Cache url must be 'memory' or 'redis://host:port/db' (rediss://, "
                             f"unix://), got {redact(self.url)!r}")
        if self.budget_bytes is not None and self.budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0 (or None for the default)")
        if self.ods and not is_redis(self.url):
            raise ValueError("Cache(ods=True) shares a cache between jobs: it needs "
                             "url='redis://host:port/db'")
        if self.t_gpu is not None and not self.t_gpu > 0:
            raise ValueError("t_gpu must be > 0 samples/s (or None: measured)")
        if self.b_cache is not None and not self.b_cache > 0:
            raise ValueError("b_cache must be > 0 bytes/s (or None: measured)")
        if self.redis_ttl_s <= 0:
            raise ValueError("redis_ttl_s must be > 0 (seconds)")
        if self.ods_ttl_s <= 0:
            raise ValueError("ods_ttl_s must be > 0 (seconds)")
        if self.split is not None:
            bad = set(self.split) - {"encoded", "decoded", "augmented"}
            if bad or any(v < 0 for v in self.split.values()) or sum(self.split.values()) > 1 + 1e-9:
                raise ValueError("split maps 'encoded'/'decoded'/'augmented' to shares >= 0 "
                                 f"summing to at most 1, got {dict(self.split)}")

    def __repr__(self) -> str:  # the dataclass's, with the URL's password redacted
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown["url"] = redact(self.url)
        return "Cache(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


def is_redis(url: str) -> bool:
    """``url`` names a Redis server (``REDIS_SCHEMES``)."""
    return url.startswith(REDIS_SCHEMES)


# a URL's scheme, where a word starts, then its user; the password runs to the last "@"
# before the path or the first blank (a URL inside a message ends at a blank)
_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*):[^\s/]*@")
_PASSWORD_ARG = re.compile(r"([?&]password=)[^&#\s]*")


def redact(text: str) -> str:
    """``text`` (a URL, or a message naming URLs anywhere in it) with every URL's password
    replaced by ``***``, in the userinfo (``redis://user:pw@host``, ``redis://:pw@host``)
    and in a ``password=`` query argument (which redis-py also reads): what headrace prints
    wherever it names the server or repeats an error that may name it."""
    return _PASSWORD_ARG.sub(r"\1***", _USERINFO.sub(r"\1:***@", text))


def default_budget() -> tuple[int, str]:
    """The default budget (see ``Cache.budget_bytes``) in bytes, and what bounded it, in
    words."""
    from headrace import units

    mem = resources.available_memory()  # within a cgroup's limit
    budget, why = int(mem * DEFAULT_MEMORY_SHARE), f"25% of {units.size(mem)} available memory"
    try:
        st = os.statvfs("/dev/shm")
        shm = st.f_bavail * st.f_frsize
        if shm * DEFAULT_SHM_SHARE < budget:
            budget, why = int(shm * DEFAULT_SHM_SHARE), f"50% of /dev/shm's {units.size(shm)} free"
    except OSError:
        pass
    return budget, why
