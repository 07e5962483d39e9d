"""Seneca's model-driven partitioning (MDP, §5.1, Equations 1-9): how to split a cache budget.

Pure: measured or configured numbers in, a split and its predicted throughput out. All rates are
per node in samples per second, bandwidths in bytes per second, sizes in bytes per sample.

Departure from the paper, which uses one inflation factor M for both processed forms: the
decoded and augmented forms have their own measured sizes here (``size_decoded``,
``size_augmented``). A form fetched from the cache costs cache and network bandwidth at its own
size; what reaches the accelerator over PCIe is always the augmented form. With
``size_decoded == size_augmented == M × size_encoded`` the equations are the paper's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

from headrace.profiler.report import PipelineProfile

INF = math.inf


@dataclasses.dataclass(frozen=True)
class DsiParams:
    """Inputs of the model (Table 3 of the paper).

    Attributes:
        n_total: samples in the dataset (N_total).
        cache_bytes: the cache's size (S_mem / S_cache), bytes.
        size_encoded: bytes of a sample's encoded form (S_data).
        size_decoded: bytes of its decoded form (M × S_data in the paper).
        size_augmented: bytes of its augmented form (M × S_data in the paper).
        t_decode_augment: CPU throughput of all steps after the encoded form, samples/s per
            node (T_{D+A}: the profiler's per-step times, summed, over the workers).
        t_augment: CPU throughput of the steps after the decoded form (T_A), samples/s per node.
        t_gpu: the accelerator's ingestion rate, samples/s per node (T_GPU; ``inf``: unknown,
            the input pipeline is the only limit).
        b_cache: cache bandwidth, bytes/s (B_cache).
        b_storage: storage bandwidth, bytes/s (B_storage).
        b_nic, b_pcie: per-node network and PCIe bandwidth, bytes/s (``inf``: not a limit).
        c_nw, c_pcie: gradient bytes per sample over network and PCIe (C_nw, C_PCIe).
        nodes: training nodes (n).
    """

    n_total: int
    cache_bytes: float
    size_encoded: float
    size_decoded: float
    size_augmented: float
    t_decode_augment: float
    t_augment: float
    t_gpu: float = INF
    b_cache: float = INF
    b_storage: float = INF
    b_nic: float = INF
    b_pcie: float = INF
    c_nw: float = 0.0
    c_pcie: float = 0.0
    nodes: int = 1


def _div(a: float, b: float) -> float:
    return INF if b <= 0 else a / b


def largest_form(p: DsiParams, forms: Iterable[str]) -> float:
    """Bytes of the largest of ``forms`` (``encoded``, ``decoded``, ``augmented``): the value
    size B_cache is measured at."""
    sizes = {"encoded": p.size_encoded, "decoded": p.size_decoded,
             "augmented": p.size_augmented}
    return max(sizes[f] for f in forms)


def _fetch_and_feed(p: DsiParams, size: float) -> float:
    """The terms every case shares: fetching ``size`` bytes from the cache over the network,
    the augmented form over PCIe, and the accelerator."""
    n = p.nodes
    return min(_div(p.b_cache, size), _div(n * p.b_nic, size + p.c_nw),
               _div(n * p.b_pcie, p.size_augmented + p.c_pcie), n * p.t_gpu)


def dsi_augmented(p: DsiParams) -> float:
    """Equation 1: samples/s when every sample comes augmented from the cache."""
    return _fetch_and_feed(p, p.size_augmented)


def dsi_decoded(p: DsiParams) -> float:
    """Equation 3: decoded from the cache, augmented on the CPU."""
    return min(_fetch_and_feed(p, p.size_decoded), p.nodes * p.t_augment)


def dsi_encoded(p: DsiParams) -> float:
    """Equation 5: encoded from the cache, decoded and augmented on the CPU."""
    return min(_fetch_and_feed(p, p.size_encoded), p.nodes * p.t_decode_augment)


def dsi_storage(p: DsiParams) -> float:
    """Equation 7: read from storage, decoded and augmented on the CPU."""
    return min(dsi_encoded(p), _div(p.b_storage, p.size_encoded))


def cached_counts(p: DsiParams, x_e: float, x_d: float, x_a: float) -> tuple[float, float, float, float]:
    """Equations 2, 4, 6, 8: (N_A, N_D, N_E, N_storage) for the shares ``x_*`` of the cache."""
    n_a = min(p.n_total, _div(x_a * p.cache_bytes, p.size_augmented) if x_a else 0.0)
    n_d = min(p.n_total - n_a, _div(x_d * p.cache_bytes, p.size_decoded) if x_d else 0.0)
    n_e = min(p.n_total - n_a - n_d, _div(x_e * p.cache_bytes, p.size_encoded) if x_e else 0.0)
    return n_a, n_d, n_e, p.n_total - n_a - n_d - n_e


def dsi_overall(p: DsiParams, x_e: float, x_d: float, x_a: float) -> float:
    """Equation 9: the predicted throughput (samples/s) of a split."""
    n_a, n_d, n_e, n_s = cached_counts(p, x_e, x_d, x_a)
    parts = ((n_a, dsi_augmented), (n_d, dsi_decoded), (n_e, dsi_encoded), (n_s, dsi_storage))
    return sum(n / p.n_total * f(p) for n, f in parts if n > 0)


@dataclasses.dataclass(frozen=True)
class Split:
    """Shares of the cache per form and the model's predicted throughput (samples/s)."""

    encoded: float
    decoded: float
    augmented: float
    predicted: float

    def shares(self) -> dict[str, float]:
        return {k: v for k, v in (("encoded", self.encoded), ("decoded", self.decoded),
                                  ("augmented", self.augmented)) if v > 0}

    def describe(self) -> str:
        parts = (", ".join(f"{k} {100 * v:.0f}%" for k, v in self.shares().items())
                 or "nothing cached")
        return f"{parts}: {self.predicted:.0f} samples/s predicted"


def best_split(p: DsiParams, forms: tuple[str, ...] = ("encoded", "decoded", "augmented"),
               step: float = 0.01) -> Split:
    """Brute force over the shares at ``step`` (1%) granularity; ``forms``: those allowed.

    Ties (shares beyond what the dataset needs) go to the least augmented share (augmented
    entries must be refilled) and then the most decoded one. With no budget
    (``cache_bytes <= 0``) every split ties: nothing is cached, every sample comes from storage
    (Eq. 7), and the split says so rather than name a form.
    """
    if p.cache_bytes <= 0:
        return Split(0.0, 0.0, 0.0, dsi_overall(p, 0.0, 0.0, 0.0))
    k = round(1 / step)
    best: Split | None = None
    for a in range(k + 1) if "augmented" in forms else (0,):
        for d in range(k - a, -1, -1) if "decoded" in forms else (0,):
            e = k - a - d if "encoded" in forms else 0
            x = (e / k, d / k, a / k)
            s = Split(*x, dsi_overall(p, *x))
            if best is None or s.predicted > best.predicted + 1e-9:
                best = s
    assert best is not None
    return best


SWITCH_GAIN = 0.05
"""How much faster (a share of its predicted samples/s) MDP's best split must be predicted
than the split the last epoch ran with, predicted again on the same numbers, to replace it. A
switch gives budget to a form whose entries the next epoch stores anew (its lookups miss) and
takes it from one whose entries it drops: at least an epoch of misses, for a gain the model
predicts per epoch. Predictions move by a few percent between epochs as the profile's means,
the training loop's rate and the cache's bandwidth are measured again, and near a tie each
such move switched."""


def kept_split(p: DsiParams, best: Split, last: dict[str, float],
               forms: tuple[str, ...]) -> Split | None:
    """The split the last epoch ran with (``last``: shares per form), predicted on ``p``,
    unless ``best`` is predicted more than ``SWITCH_GAIN`` faster; None (switch to ``best``)
    then, and where there is no last split or it gives budget to a form not in ``forms``.

    A share of the augmented form over ``best``'s goes to the last split's exact form
    (decoded, else encoded; none: switch): a shared augmented entry is served once and
    dropped, so there is nothing of it to keep, and where every split ties (a training loop
    slower than all) the default's half stayed for good, where ``best_split``'s tie-break
    gives it none; refusing the keep outright dropped the exact form's entries (reviews)."""
    if not last or any(f not in forms for f in last):
        return None
    e, d, a = (last.get("encoded", 0.0), last.get("decoded", 0.0), last.get("augmented", 0.0))
    if a > best.augmented:
        if not (d or e):
            return None
        surplus, a = a - best.augmented, best.augmented
        d, e = (d + surplus, e) if d else (d, e + surplus)
    x = (e, d, a)
    again = Split(*x, dsi_overall(p, *x))
    return again if best.predicted <= again.predicted * (1 + SWITCH_GAIN) else None


def single_tier_splits(p: DsiParams, forms: tuple[str, ...]) -> list[Split]:
    """The whole cache to one form, for each allowed form (``explain()`` shows them beside);
    none with no budget (each would cache nothing)."""
    out: list[Split] = []
    if p.cache_bytes <= 0:
        return out
    for f in forms:
        x = (float(f == "encoded"), float(f == "decoded"), float(f == "augmented"))
        out.append(Split(*x, dsi_overall(p, *x)))
    return out


def consumer_rate(samples: int, wall_s: float, stall_s: float) -> float:
    """T_GPU measured on the training loop: samples it took per second of its own time
    (``wall_s - stall_s``: the epoch's wall time minus what it waited in ``iter()`` and ``next()``), so
    the rate it would ingest if batches were free. ``inf`` when there is nothing to go by
    (no samples, or no time of its own measured)."""
    own = wall_s - stall_s
    if samples <= 0 or own <= 0:
        return INF
    return samples / own


def params_from_profile(
    profile: PipelineProfile,
    n_total: int,
    positions: dict[str, int],
    workers: int,
    cache_bytes: float,
    b_cache: float,
    t_gpu: float = INF,
) -> DsiParams | None:
    """The model's inputs from a measured profile (None until every step has been measured).

    ``positions``: execution step of each form (``encoded``, ``decoded``, ``augmented``); a
    missing form takes the size of the nearest processed one. CPU throughputs are ``workers``
    divided by the summed mean wall time of the steps after the form; storage bandwidth is
    what ``load`` delivered: encoded bytes per mean load time, times the workers.
    """
    steps = profile.steps
    if not steps or any(s.count == 0 for s in steps) or profile.samples == 0:
        return None
    last = len(steps) - 1
    enc = positions.get("encoded", 0)
    dec = positions.get("decoded", enc)
    size = [max(1.0, s.bytes_out_mean) for s in steps]
    after = [sum(s.wall_mean for s in steps[i + 1:]) for i in range(len(steps))]
    w = max(1, workers)
    load = steps[0].wall_mean
    return DsiParams(
        n_total=n_total,
        cache_bytes=cache_bytes,
        size_encoded=size[enc],
        size_decoded=size[dec],
        size_augmented=size[positions.get("augmented", last)],
        t_decode_augment=_div(w, after[enc]),
        t_augment=_div(w, after[dec]),
        t_gpu=t_gpu,
        b_cache=b_cache,
        b_storage=_div(size[0] * w, load),
    )
