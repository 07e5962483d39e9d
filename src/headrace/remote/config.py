"""``Remote``: where remote workers run and what they cost (plain data; imports no Ray)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Remote:
    """Offload samples to Ray actors on other nodes (``Options(remote=Remote(...))``).

    Attributes:
        address: the Ray cluster to join (``ray.init(address=...)``): ``"auto"`` finds a
            running cluster on this machine, ``"ray://host:10001"`` a remote one. When this
            process is already connected to Ray (``ray.is_initialized()``), that connection is
            used and ``address`` is only named in messages.
        max_workers: remote workers (one Ray actor each, ``num_cpus`` CPUs) at most. ``None``:
            the cluster's CPUs outside this node, divided by ``num_cpus`` (at least 1).
        cost_per_worker_hour: what one remote worker costs per hour (any currency; ``c_w`` of
            Pecan's bpc). ``None``: no cost known; AutoPlacement then minimises workers at equal
            batch time.
        local_cost_per_hour: what the training host costs per hour (``c_a``).
        required: ``True``: an unreachable cluster is an error naming ``address``. ``False``:
            the loader warns and runs on local workers only.
        read_source: remote workers read a sample themselves (step 0, ``Source.load``): the
            source is reachable from their nodes (shared storage). ``False``: the training
            host loads the sample (in a thread of the training process, unseeded per sample)
            and ships the loaded value; it needs steps after ``load`` (a ``Pipeline``): over a
            dataset whose steps all run in ``__getitem__`` the loader raises.
        num_cpus: CPUs a remote worker reserves (Ray's ``num_cpus``).
        resources: Ray custom resources a remote worker requires (e.g. ``{"cpu_node": 0.01}``
            to keep workers off the training host).
        workers: remote workers to start with (``None``: ``max_workers``, or 0 with
            ``autoplace``).
        autoplace: scale remote and local workers at run time to the cheapest configuration
            without data stalls (Pecan's AutoPlacement, ``planner/placement.py``), between 0
            and ``max_workers`` remote and 1 and the loader's local worker slots
            (``num_workers``, or the autoscaler's bound with ``num_workers="auto"``). Once
            converged it tries one remote worker fewer and one more, in turn, now and then
            (undone unless batches got cheaper; the wait doubles after each undone try).
        slow_lane: remote workers take slow-lane samples (MinatoLoader: handed off over the
            timeout, resumed at their next step) before fresh ones, beyond the slow-lane share
            of the local pool, so the local workers keep serving the fast lane. The partial
            value crosses the network: it pays when the steps left cost more than moving it.
        window: batches per AutoPlacement measurement (Pecan's X).
        threshold: relative batch-time change AutoPlacement acts on (Pecan's T).
    """

    address: str = "auto"
    max_workers: int | None = None
    cost_per_worker_hour: float | None = None
    local_cost_per_hour: float | None = None
    required: bool = True
    read_source: bool = True
    num_cpus: float = 1.0
    resources: Mapping[str, float] | None = None
    workers: int | None = None
    autoplace: bool = False
    slow_lane: bool = False
    window: int = 20
    threshold: float = 0.03

    def __post_init__(self) -> None:
        if self.max_workers is not None and self.max_workers < 0:
            raise ValueError("Remote(max_workers=...) must be >= 0 (or None)")
        if self.workers is not None and self.workers < 0:
            raise ValueError("Remote(workers=...) must be >= 0 (or None)")
        if (self.workers is not None and self.max_workers is not None
                and self.workers > self.max_workers):
            raise ValueError("Remote(workers=...) must be <= max_workers")
        for name in ("cost_per_worker_hour", "local_cost_per_hour"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"Remote({name}=...) must be >= 0 (or None)")
        if self.window < 1 or not 0 < self.threshold < 1:
            raise ValueError("Remote(window=...) must be >= 1 and threshold in (0, 1)")
        if self.num_cpus <= 0:
            raise ValueError("Remote(num_cpus=...) must be > 0")
