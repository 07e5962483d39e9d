"""Which prefix of the pipeline each sample runs on the storage node (SOPHON §3.2). Pure.

A sample is read on the storage node (step 0, ``load``) and may run the next steps there
before it crosses the network; the training side runs the rest. Its *stop* is the first step
the training side runs: ``1`` sends the raw bytes (no offloading), ``n`` (the pipeline's
step count, load included) sends the finished sample.

SOPHON's decision, per sample: the prefix whose output is smallest (ties: the shortest, so
raw when nothing shrinks); *efficiency* = bytes saved against raw ÷ the storage CPU-seconds
that prefix costs. Samples are taken in decreasing efficiency while the network is still the
predominant term of the epoch (SOPHON's ``T_Net`` against ``T_CS``, ``T_CC``, ``T_G``), and
a sample is only taken when it does not make the predicted epoch longer (one that would is left
raw, and the next ones are tried). A sample that is smallest raw is never offloaded.

Units: bytes, seconds, bytes per second; CPU times are the steps' thread CPU seconds as
profiled on the training side (SOPHON assumes the same CPU type on both sides).
The same profile also gives the comparison policies of SOPHON's evaluation: No-Off, All-Off,
a fixed prefix for every sample (Resize-Off: decode and crop) and FastFlow-style
all-or-nothing (whichever of No-Off and All-Off the model predicts faster).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from headrace.profiler.sample_sizes import SampleProfile

POLICIES = ("headrace", "no-off", "all-off", "resize-off", "fastflow")
"""Policy names ``decide`` accepts (``headrace``: SOPHON's per-sample greedy)."""

MIN_CPU_S = 1e-9
"""CPU seconds a prefix is taken to cost at least (a free prefix that shrinks comes first)."""


@dataclasses.dataclass(frozen=True)
class Resources:
    """What the epoch runs on.

    ``bandwidth``: bytes per second from the storage node to the training side.
    ``storage_cores``: CPU cores preprocessing on the storage node. ``compute_cores``: CPU
    cores (workers) preprocessing on the training side. ``gpu_s``: the accelerator's time for
    one epoch in seconds (SOPHON's ``T_G``; 0 when unknown: no accelerator bound).
    """

    bandwidth: float
    storage_cores: float
    compute_cores: float
    gpu_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth > 0 or not self.storage_cores > 0 or not self.compute_cores > 0:
            raise ValueError("bandwidth, storage_cores and compute_cores must be > 0")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """The model's epoch: ``bytes`` crossing the network, and the four times of SOPHON §3.2
    in seconds: ``net_s`` (bytes ÷ bandwidth), ``storage_s`` (storage-side CPU ÷ its cores),
    ``compute_s`` (training-side CPU ÷ its cores), ``gpu_s``. The stages overlap, so the
    epoch takes the largest (``epoch_s``)."""

    bytes: float
    net_s: float
    storage_s: float
    compute_s: float
    gpu_s: float

    @property
    def epoch_s(self) -> float:
        return max(self.net_s, self.storage_s, self.compute_s, self.gpu_s)

    @property
    def bottleneck(self) -> str:
        """The predominant term: ``network``, ``storage CPU``, ``training CPU`` or ``GPU``."""
        terms = {"network": self.net_s, "storage CPU": self.storage_s,
                 "training CPU": self.compute_s, "GPU": self.gpu_s}
        return max(terms, key=terms.__getitem__)


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A policy's stop per sample (``stops[i]``: the first step sample ``i`` runs on the
    training side, ``1..n``) and its predicted epoch. ``offloaded``: samples with at least one
    step after ``load`` on the storage node."""

    policy: str
    stops: np.ndarray
    predicted: Prediction
    offloaded: int
    reason: str = ""

    @property
    def share(self) -> float:
        """Share of the samples offloaded (0..1)."""
        return self.offloaded / len(self.stops) if len(self.stops) else 0.0

    def describe(self) -> str:
        p = self.predicted
        return (f"near-storage {self.policy}: {self.offloaded}/{len(self.stops)} samples "
                f"offloaded ({100 * self.share:.0f}%); predicted {p.bytes / 1e6:.1f} MB over "
                f"the link, epoch {p.epoch_s:.2f} s (network {p.net_s:.2f} s, storage CPU "
                f"{p.storage_s:.2f} s, training CPU {p.compute_s:.2f} s, GPU {p.gpu_s:.2f} s; "
                f"bound: {p.bottleneck})" + (f"; {self.reason}" if self.reason else ""))


def predict(profile: SampleProfile, stops: np.ndarray, res: Resources) -> Prediction:
    """The model's epoch when sample ``i`` crosses the network before step ``stops[i]``."""
    sizes, cpu, _ = profile.filled()
    rows = np.arange(len(stops))
    stops = np.asarray(stops, dtype=np.int64)
    moved = float(sizes[rows, stops - 1].sum())
    cum = np.cumsum(cpu, axis=1)
    storage = float(cum[rows, stops - 1].sum())  # load and the prefix
    compute = float(cum[:, -1].sum()) - storage
    return Prediction(moved, moved / res.bandwidth, storage / res.storage_cores,
                      compute / res.compute_cores, res.gpu_s)


def _plan(policy: str, profile: SampleProfile, stops: np.ndarray, res: Resources,
          reason: str = "") -> Plan:
    stops = stops.astype(np.int16)
    return Plan(policy, stops, predict(profile, stops, res), int((stops > 1).sum()), reason)


def no_off(profile: SampleProfile, res: Resources) -> Plan:
    """Raw bytes for every sample (the job as it runs without near-storage preprocessing)."""
    return _plan("no-off", profile, np.ones(len(profile.sizes), np.int16), res)


def all_off(profile: SampleProfile, res: Resources) -> Plan:
    """Every step of every sample on the storage node."""
    return _plan("all-off", profile, np.full(len(profile.sizes), profile.steps, np.int16), res)


def prefix_off(profile: SampleProfile, res: Resources, stop: int,
               policy: str = "resize-off") -> Plan:
    """The same prefix ``[0, stop)`` for every sample (Resize-Off: up to decode and crop)."""
    if not 1 <= stop <= profile.steps:
        raise ValueError(f"stop must be in 1..{profile.steps}, got {stop}")
    return _plan(policy, profile, np.full(len(profile.sizes), stop, np.int16), res)


def fastflow(profile: SampleProfile, res: Resources) -> Plan:
    """FastFlow-style all-or-nothing: every step of every sample offloaded or none, whichever
    the model predicts faster (FastFlow treats the pipeline as one unit and does not tell
    samples apart; ties keep everything on the training side)."""
    none, every = no_off(profile, res), all_off(profile, res)
    if every.predicted.epoch_s < none.predicted.epoch_s:
        return dataclasses.replace(every, policy="fastflow", reason="all-off predicted faster")
    return dataclasses.replace(none, policy="fastflow", reason="no-off predicted as fast")


def best_prefixes(profile: SampleProfile) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample: the stop of its smallest form (ties: the shortest prefix), the bytes it
    saves against raw, and the storage CPU-seconds of the steps after ``load`` it needs."""
    sizes, cpu, known = profile.filled()
    best = np.argmin(sizes, axis=1)  # the first minimum: raw when nothing is smaller
    rows = np.arange(len(sizes))
    saved = sizes[:, 0] - sizes[rows, best]
    cost = np.cumsum(cpu, axis=1)[rows, best] - cpu[:, 0]
    saved[~known] = 0.0
    return best + 1, saved, cost


def sophon(profile: SampleProfile, res: Resources) -> Plan:
    """SOPHON's greedy (§3.2): samples in decreasing bytes saved per storage CPU-second,
    each at its smallest prefix, until the network is no longer the epoch's predominant term
    (the paper's stop) or none is left. A sample whose storage CPU would lengthen the predicted
    epoch is left raw and the next ones are tried (headrace's guard: the room storage CPU has
    under the network time only shrinks as samples are taken, so a sample refused once stays
    refused)."""
    stops, saved, cost = best_prefixes(profile)
    base = no_off(profile, res).predicted
    cand = np.flatnonzero(saved > 0)
    if len(cand) == 0:
        return dataclasses.replace(no_off(profile, res), policy="headrace",
                                   reason="no sample is smaller after any step than raw")
    eff = saved[cand] / np.maximum(cost[cand], MIN_CPU_S)
    order = cand[np.argsort(-eff, kind="stable")]
    net, storage, compute, gpu = base.net_s, base.storage_s, base.compute_s, res.gpu_s
    taken: list[int] = []
    refused, bound = 0, ""
    d_net = (saved[order] / res.bandwidth).tolist()
    d_cpu = cost[order].tolist()
    for k, dn, c in zip(order.tolist(), d_net, d_cpu, strict=True):
        if net < storage or net < compute or net < gpu:
            terms = {"storage CPU": storage, "training CPU": compute, "GPU": gpu}
            top = max(terms, key=terms.__getitem__)
            bound = f"{top} {terms[top]:.2f} s against network {net:.2f} s"
            break
        # net is the epoch now, and taking k only lowers net and training CPU: the epoch
        # gets longer exactly when storage CPU would pass the network time
        s_after = storage + c / res.storage_cores
        if s_after > net:
            refused += 1
            continue
        net, storage, compute = net - dn, s_after, compute - c / res.compute_cores
        taken.append(k)
    chosen = np.ones(len(stops), np.int16)
    chosen[taken] = stops[taken]
    return _plan("headrace", profile, chosen, res, _why(len(order), len(taken), refused, bound))


def _why(candidates: int, taken: int, refused: int, bound: str) -> str:
    """``sophon``'s reason, in words, from what ended its loop: ``bound``, the term that
    overtook the network (""): none did), ``refused`` samples left raw by the guard."""
    if bound:
        why = (f"the network is not the bottleneck ({bound})" if taken == 0 else
               f"stopped where the network stopped being the bottleneck ({bound})")
    elif taken == candidates:
        return "every sample that shrinks is offloaded"
    else:
        why = "the network is still the bottleneck"
    if refused:
        why += (f"; {refused} of {candidates} samples that shrink left raw: each would make "
                "storage CPU outlast the network time, lengthening the epoch")
    return why


def decide(policy: str, profile: SampleProfile, res: Resources,
           resize_stop: int | None = None) -> Plan:
    """The plan of ``policy`` (one of ``POLICIES``); ``resize_stop``: Resize-Off's stop."""
    if policy == "headrace":
        return sophon(profile, res)
    if policy == "no-off":
        return no_off(profile, res)
    if policy == "all-off":
        return all_off(profile, res)
    if policy == "fastflow":
        return fastflow(profile, res)
    if policy == "resize-off":
        if resize_stop is None:
            raise ValueError("resize-off needs resize_stop: the first step after the crop")
        return prefix_off(profile, res, resize_stop)
    raise ValueError(f"unknown near-storage policy {policy!r}; one of {POLICIES}")


def io_bound(net_thp: float, cpu_thp: float, gthp: float = math.inf) -> tuple[bool, str]:
    """Stage 1 of SOPHON's profiler (§3.1): is the job bound by the network?

    Throughputs in samples per second: ``net_thp`` raw samples the link carries (bandwidth ÷
    mean raw bytes), ``cpu_thp`` samples the training side's CPUs preprocess, ``gthp`` samples
    the accelerator consumes (``profiler/probe.py``; ``inf`` unknown). Offloading can only help
    when the link is the slowest of the three.
    """
    slowest = min(cpu_thp, gthp)
    if net_thp < slowest:
        return True, (f"I/O-bound: the link carries {net_thp:.1f} raw samples/s, the CPUs "
                      f"{cpu_thp:.1f}/s, the accelerator {gthp:.1f}/s")
    which = "CPU" if cpu_thp <= gthp else "accelerator"
    return False, (f"not I/O-bound ({which} is slower): link {net_thp:.1f} samples/s, CPUs "
                   f"{cpu_thp:.1f}/s, accelerator {gthp:.1f}/s")
