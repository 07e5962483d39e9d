"""``Remote``: where remote workers run and what they cost (plain data; imports no Ray)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from collections.abc import Mapping, Sequence

from headrace.errors import PipelineError


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
        required: ``True``: an unreachable cluster is an error naming ``address``, and so are
            remote workers that cannot start (``remote/starts.py``: ``MAX_START_FAILURES`` in a
            row), naming the remote exception. ``False``: the loader warns and runs on local
            workers only. Either way, workers that no live node can hold now (a resource none
            has: ``unplaceable``, checked when the loader joins) are named in a warning and
            still asked for, for a cluster that starts nodes on demand.
        read_source: remote workers read a sample themselves (step 0, ``Source.load``): the
            source is reachable from their nodes (shared storage). ``False``: the training
            host loads the sample (in a thread of the training process, unseeded per sample)
            and ships the loaded value; it needs steps after ``load`` (a ``Pipeline``): over a
            dataset whose steps all run in ``__getitem__`` the loader raises. A loaded value
            that would not arrive as it is (it does not pickle, or parts of it share memory:
            ``runtime/faithful.py``) is not shipped: a local worker loads that sample again.
        num_cpus: CPUs a remote worker reserves (Ray's ``num_cpus``).
        resources: Ray custom resources a remote worker requires (e.g. ``{"cpu_node": 0.01}``
            to keep workers off the training host): amounts finite, >= 0, and 0 or at least
            0.0001 (Ray's unit); not ``CPU`` (that is ``num_cpus``) nor ``GPU``.
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
        # every field that reaches Ray or the planner is checked here, so a value that can
        # never work fails where it was written, not in a proxy thread at run time
        if not isinstance(self.address, str):
            raise TypeError(f"Remote(address={self.address!r}) must be a str (\"auto\", "
                            "\"host:6379\" or \"ray://host:10001\")")
        for name in ("required", "read_source", "autoplace", "slow_lane"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"Remote({name}={getattr(self, name)!r}) must be True or False")
        for name in ("max_workers", "workers"):
            _count(name, getattr(self, name), lowest=0, optional=True)
        if (self.workers is not None and self.max_workers is not None
                and self.workers > self.max_workers):
            raise ValueError(f"Remote(workers={self.workers}) must be <= max_workers "
                             f"({self.max_workers})")
        for name in ("cost_per_worker_hour", "local_cost_per_hour"):
            v = getattr(self, name)
            if v is not None and not (_real(name, v) >= 0 and math.isfinite(v)):
                raise ValueError(f"Remote({name}={v!r}) must be a finite number >= 0 (or None)")
        _count("window", self.window, lowest=1, optional=False)
        if not 0 < _real("threshold", self.threshold) < 1:
            raise ValueError(f"Remote(threshold={self.threshold!r}) must be in (0, 1)")
        if not (_real("num_cpus", self.num_cpus) >= RESOURCE_UNIT and math.isfinite(self.num_cpus)):
            raise ValueError(f"Remote(num_cpus={self.num_cpus!r}) must be a finite number >= "
                             f"{RESOURCE_UNIT} (Ray's smallest unit)")
        _check_resources(self.resources)
        # as Python's own int and float: Ray type-checks num_cpus as (int, float), so NumPy's
        # numbers or a Fraction passed here and failed in a proxy thread
        for name in ("max_workers", "workers", "window"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))
        for name in ("cost_per_worker_hour", "local_cost_per_hour", "threshold", "num_cpus"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, float(getattr(self, name)))
        if self.resources is not None:
            object.__setattr__(self, "resources",
                               {k: float(v) for k, v in self.resources.items()})


RESOURCE_UNIT = 0.0001
"""The smallest non-zero amount of a resource Ray accepts in a request."""


def _real(name: str, v: object) -> float:
    """``v`` when it is a real number (not a bool), else a TypeError naming ``name``."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"Remote({name}={v!r}) must be a number")
    return float(v)


def _count(name: str, v: object, lowest: int, optional: bool) -> None:
    """``v`` is an int >= ``lowest`` (or None when ``optional``)."""
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"Remote({name}={v!r}) must be an int" + (" (or None)" if optional
                                                                   else ""))
    if v < lowest:
        raise ValueError(f"Remote({name}={v!r}) must be >= {lowest}" + (" (or None)" if optional
                                                                        else ""))


def _check_resources(resources: object) -> None:
    """Ray's rules for an actor's ``resources``, checked before Ray sees them: string names,
    finite amounts >= 0 in units of ``RESOURCE_UNIT``, and no ``CPU`` or ``GPU`` (Ray takes
    those as ``num_cpus`` / ``num_gpus`` only; a remote worker's CPUs are ``num_cpus``)."""
    if resources is None:
        return
    if not isinstance(resources, Mapping):
        raise TypeError(f"Remote(resources={resources!r}) must be a mapping of resource name "
                        "to amount (or None)")
    for k, v in resources.items():
        if not isinstance(k, str):
            raise TypeError(f"Remote(resources={{{k!r}: ...}}): resource names are str")
        if k == "CPU":
            raise ValueError(f"Remote(resources={{'CPU': {v!r}}}): Ray takes CPUs as num_cpus, "
                             "never in resources: use Remote(num_cpus=...)")
        if k == "GPU":
            raise ValueError(f"Remote(resources={{'GPU': {v!r}}}): Ray takes GPUs as num_gpus, "
                             "never in resources, and remote workers run their steps on CPUs")
        amount = _real(f"resources={{{k!r}: ...}}", v)
        if not math.isfinite(amount) or amount < 0 or 0 < amount < RESOURCE_UNIT:
            raise ValueError(f"Remote(resources={{{k!r}: {v!r}}}): an amount must be finite, "
                             f">= 0, and 0 or at least {RESOURCE_UNIT}")


NOT_SHOWN = ("memory", "object_store_memory")
"""Resources of a cluster's totals that a message about placement leaves out (bytes, which no
worker asks for), with Ray's per-node ``node:<address>`` ones."""


def unplaceable(cfg: Remote, totals: Mapping[str, float]) -> str | None:
    """Why no remote worker of ``cfg`` can be placed on a cluster whose live nodes have
    ``totals`` in all (``ray.cluster_resources()``), in words; None: the totals hold one.
    A worker asks for ``num_cpus`` CPUs and each of its ``resources``: one missing from every
    node (a misspelt name) or asked beyond what all nodes have together is named, with what
    the nodes have. Totals, not nodes: a worker that fits only across two nodes is not caught
    (the proxy warns when one is not placed in time, ``ray_backend.START_WARN_S``)."""
    asks = {"CPU": cfg.num_cpus, **{k: v for k, v in (cfg.resources or {}).items() if v > 0}}
    shown = {k: v for k, v in sorted(totals.items())
             if not k.startswith("node:") and k not in NOT_SHOWN}
    short = []
    for name, amount in asks.items():
        have = float(totals.get(name, 0.0))
        if have + 1e-9 >= amount:
            continue
        field = "num_cpus" if name == "CPU" else f"resources={{{name!r}: {amount:g}}}"
        if have > 0:
            short.append(f"Remote({field}) asks for more {name} than the nodes have in all "
                         f"({have:g})")
            continue
        near = difflib.get_close_matches(name, [k for k in shown if k != "CPU"], n=1)
        short.append(f"Remote({field}) asks for {name!r}, which no node has"
                     + (f" (did you mean {near[0]!r}?)" if near else ""))
    if not short:
        return None
    offered = ", ".join(f"{k} {v:g}" for k, v in shown.items()) or "none"
    return "; ".join(short) + f"; the cluster's live nodes have in all: {offered}"


def check_read_source(cfg: Remote, step_names: Sequence[str], embedded: bool) -> None:
    """Raise ``PipelineError`` for ``Remote(read_source=False)`` over a pipeline whose steps
    all run in ``load`` (a dataset's ``__getitem__``; ``embedded``: its Compose measured in
    place): the training host would load each sample, in threads of the training process, and
    ship nothing remote to run, its global random generators neither seeded per sample nor
    kept from the training loop's."""
    if not cfg.read_source and (len(step_names) < 2 or embedded):
        raise PipelineError(
            "Remote(read_source=False) ships each loaded sample to the remote workers for the "
            "steps after `load`, but this dataset's steps all run inside its __getitem__ (its "
            "`load`): nothing would run remotely, and the training process would run them in "
            "its own threads, drawing from the training loop's global random generators. Use "
            "read_source=True (the remote nodes read the dataset) or declare the steps after "
            "loading with headrace.Pipeline")
