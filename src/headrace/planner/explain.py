"""``loader.explain()``: every decision and the measured numbers behind it, as text (pure)."""

from __future__ import annotations

import dataclasses
import math

from headrace import units
from headrace.planner import timeout as timeout_policy
from headrace.planner.offload import OffloadDecision
from headrace.planner.order import OrderPlan
from headrace.planner.workers import ScaleDecision
from headrace.profiler.report import PipelineProfile
from headrace.telemetry.stats import EpochStats, LoaderStats


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the loader knows when asked to explain itself."""

    fingerprint: str
    samples: int | None  # None: a map-style dataset without __len__
    batch_size: int | None
    workers: int | str
    batching: str  # which batching applies and why (runtime/ordering.py describe())
    declared: tuple[str, ...]
    executed: tuple[str, ...]
    order: OrderPlan | None
    next_order: OrderPlan | None
    handoff: bool
    stats: LoaderStats
    timeout_samples: int  # samples measured in this run in the hand-off timeout's window
    scale_decisions: tuple[ScaleDecision, ...]
    profile: PipelineProfile | None
    profile_note: str
    cache_lines: tuple[str, ...] = ()
    """Lines about the sample cache (``CacheSession.explain_lines``)."""
    remote: RemoteFacts | None = None
    executor: str | None = None  # executor="auto": what it chose and why
    start_note: str | None = None  # num_workers="auto": its first count from a stored profile
    handoff_off: str = ""  # why the slow lane is off (``handoff`` False), in words
    move_cost_s: float = 0.0  # training-process seconds to forward one slow-lane sample
    messages: str | None = None  # worker processes: samples per message (planner/queueing.py)
    collate: str | None = None  # where a user collate_fn runs (runtime/collate_rng.py)
    samples_done: int = 0  # samples delivered over the loader's life (stats keep 1000 epochs)
    running: bool = False  # the last of ``stats.epochs`` is under way (an iterator still open)
    timeout_stored: int = 0  # a stored profile's quantiles still in that window (not samples)


def _timeout_basis(f: Facts) -> str:
    """What the hand-off timeout's percentile is taken over, in words: the samples measured
    in this run, and a stored profile's quantiles until those samples push them out."""
    measured = f"the last {f.timeout_samples} samples"
    if not f.timeout_stored:
        return measured
    stored = f"{f.timeout_stored} quantiles of the stored profile"
    return stored if not f.timeout_samples else f"{measured} and {stored}"


@dataclasses.dataclass(frozen=True)
class RemoteFacts:
    """What the remote side (``headrace.remote``) did, for ``explain()``.

    ``measured_thp``: samples/s of the last finished epoch; ``cost_per_hour``: the training host
    plus the remote workers now (None without costs); ``moves``: AutoPlacement's last moves as
    (seconds since start, local delta, remote delta, window batch time in s, reason);
    ``replans``: the offloading decided again at run time, as (seconds since ``plan_offload``,
    why, the new decision in words, remote workers asked for); ``link``: what the link probe
    measured, in words (None: not probed); ``watching``: the decision is watched.
    """

    address: str
    error: str | None
    max_workers: int
    remote_workers: int
    local_workers: int
    remote_samples: int
    lost: int
    split: int | None
    steps: tuple[str, ...]
    offload: OffloadDecision | None
    autoplace: bool
    moves: tuple[tuple[float, int, int, float, str], ...]
    measured_thp: float | None
    cost_per_hour: float | None
    replans: tuple[tuple[float, str, str, int], ...] = ()
    handed_off: int = 0
    """Samples remote workers handed off over the timeout (finished in the slow lane)."""
    handed_back: int = 0
    """Near storage: samples the storage nodes handed back at their own stop (finished here)."""
    link: str | None = None
    watching: bool = False
    extra: tuple[str, ...] = ()
    """More lines from the remote side (near storage: ``remote/storage.py``)."""
    never_started: int = 0
    """Remote workers that died before running a sample (``remote/starts.py``)."""
    start_error: str | None = None
    """Why the first of those that failed in a row did not start (the remote exception and the
    end of its traceback; None once a remote worker started since)."""
    gave_up: bool = False
    """That many in a row failed: no more remote workers are started."""
    read_local: bool = False
    """This host reads each sample (``load``) and ships it: the remote part starts after it
    (``Remote(read_source=False)``, or an offload range from step 1)."""


def remote_lines(r: RemoteFacts, total_samples: int) -> list[str]:
    """The remote side in a few lines: offload decision, split, counts, throughput, cost."""
    if r.error is not None:
        return [f"remote: not used ({r.error}; Remote(required=False))"]
    share = f"{r.remote_samples} of {total_samples} samples" if total_samples else \
        f"{r.remote_samples} samples"
    split = r.split is not None and r.split < len(r.steps)
    done = "offloaded (run remotely up to the split)" if split else "finished remotely"
    out = [f"remote: Ray cluster {r.address!r}: {r.remote_workers} remote worker(s) now (at most "
           f"{r.max_workers}), {r.local_workers} local; {share} {done}"
           + (f"; {r.handed_off} handed off by remote workers over the timeout"
              if r.handed_off else "")
           + (f"; {r.handed_back} handed back at their own stop by storage nodes, finished here"
              if r.handed_back else "")
           + (f"; {r.lost} remote worker(s) lost, their samples re-run" if r.lost else "")
           + (f"; {r.never_started} remote worker(s) never started" if r.never_started else "")]
    if r.start_error is not None:
        first = r.start_error.splitlines()[0]
        out.append(f"  remote workers could not start: {first}" + (
            "; no more are started, local workers only" if r.gave_up else ""))
    if r.offload is not None:
        out.append("  " + r.offload.describe())
    if r.link is not None:
        out.append("  " + r.link)
    if r.replans:
        out.append(f"  offloading decided again {len(r.replans)} time(s) at run time; last:")
        for t, why, what, n in r.replans[-3:]:
            out.append(f"    at {t:.1f} s: {why} -> {what}; {n} remote worker(s)")
    elif r.watching:
        out.append("  offloading watched: decided again when the cluster, the profile or the "
                   "throughput changes (not yet)")
    if split:
        start = 1 if r.read_local else 0  # it listed load as remote when this host read it
        here = f"this host runs {r.steps[0]}, " if start else ""
        out.append(f"  split: {here}remote workers run {' -> '.join(r.steps[start:r.split])}, "
                   f"local workers {' -> '.join(r.steps[r.split:])}")
    if r.offload is not None and r.offload.offload and r.measured_thp is not None:
        out.append(f"  throughput: predicted {r.offload.predicted:.1f} samples/s, measured "
                   f"{r.measured_thp:.1f} samples/s (last epoch)")
    elif r.measured_thp is not None:
        out.append(f"  throughput: measured {r.measured_thp:.1f} samples/s (last epoch)")
    if r.cost_per_hour is not None:
        per = ""
        if r.measured_thp:
            per = f", {1e6 * r.cost_per_hour / 3600 / r.measured_thp:.3f} per million samples"
        out.append(f"  cost: {r.cost_per_hour:.2f} per hour{per}")
    if r.autoplace:
        if not r.moves:
            out.append("  AutoPlacement (Pecan): measuring, no move yet")
        else:
            out.append(f"  AutoPlacement (Pecan): {len(r.moves)} move(s); last:")
            for t, dl, dr, bpt, why in r.moves[-3:]:
                out.append(f"    at {t:.1f} s: local {dl:+d}, remote {dr:+d} (window batch time "
                           f"{units.duration(bpt)}): {why}")
    out.extend(r.extra)
    return out


def explain_text(f: Facts) -> str:
    out = [
        f"headrace plan for pipeline {f.fingerprint}: "
        f"{'?' if f.samples is None else f.samples} samples, batch {f.batch_size}, "
        f"workers {f.workers}",
        "batching: " + f.batching,
        f"declared steps: {' -> '.join(f.declared)}",
    ]
    if f.executed != f.declared:
        out.append(f"running steps: {' -> '.join(f.executed)}")
    if f.order is not None:
        out += ["this epoch's " + line if i == 0 else line for i, line in enumerate(f.order.lines())]
    if f.next_order is not None and (
        f.order is None or [s.name for s in f.next_order.steps] != [s.name for s in f.order.steps]
        or f.next_order.reason != f.order.reason
    ):
        out += ["next epoch's " + line if i == 0 else line
                for i, line in enumerate(f.next_order.lines())]
    if f.executor is not None:
        out.append(f.executor)
    st = f.stats
    if not f.handoff:
        out.append("slow lane: off (" + (f.handoff_off or "a single step per sample, steps "
                                         "inside the dataset's __getitem__, or handoff=False")
                   + ")")
    elif math.isinf(st.timeout_s):
        out.append(f"slow lane: warming up, no hand-off yet ({f.timeout_samples} samples timed)")
    else:
        last = st.last
        share = ""
        if last is not None and last.fast_samples + last.slow_samples:
            n = last.fast_samples + last.slow_samples
            share = f"; last epoch {last.slow_samples} of {n} samples went slow"
        base = st.timeout_fallback_from
        fb = (f" (fallback from p{base:g}: more samples went slow over it than it implies)"
              if base is not None else "")
        floor = units.duration(timeout_policy.HANDOFF_MIN_S)  # the value the workers read
        cost = (f"; a move costs this process {units.duration(f.move_cost_s)} (measured), so a "
                "late sample moves only if its steps left typically take that plus half the "
                f"timeout, and at least {floor}" if f.move_cost_s > 0 else
                "; a late sample moves only if its steps left typically take half the timeout "
                f"and at least {floor}")
        basis = (f", fixed by TimeoutConfig(fixed_s={st.timeout_s:g}), not learned"
                 if math.isnan(st.timeout_percentile) else
                 f" = p{st.timeout_percentile:g} of per-sample time over {_timeout_basis(f)}{fb}")
        out.append(f"slow lane: hand-off timeout {units.duration(st.timeout_s)}{basis}{share}{cost}")
    if f.messages:
        out.append(f.messages)
    if f.collate:
        out.append(f.collate)
    if f.start_note:
        out.append(f"workers: {f.start_note}")
    if f.scale_decisions:
        n = len(f.scale_decisions)
        changed = sum(d.new != d.current for d in f.scale_decisions)
        out.append(f"workers: adapted {changed} time{'' if changed == 1 else 's'} in {n} decisions (Formulas 1-2); last: "
                   + f.scale_decisions[-1].describe())
    elif f.workers == "auto":  # headrace chose the count: never "as given"
        ran = next((n for _, n in reversed(st.workers_timeline) if n), None)
        out.append("workers: num_workers=\"auto\", not adapted since the start"
                   + (f" ({ran} ran;" if ran else " (") + " no decision of Formulas 1-2 yet)")
    else:
        out.append(f"workers: {f.workers} as given (never changed by headrace)")
    if st.worker_restarts:
        out.append(f"workers replaced after dying or hanging: {st.worker_restarts}")
    if f.remote is not None:
        out += remote_lines(f.remote, f.samples_done)
    out.append(f"profile: {f.profile_note}")
    if f.profile is not None and f.profile.samples:
        out.append(f"  {'step':<22}{'p50':>10}{'p90':>10}{'bytes in':>12}{'bytes out':>12}{'inflation':>11}")
        for s in f.profile.steps:
            infl = f"{s.inflation:.2f}" if s.inflation is not None else "-"
            out.append(
                f"  {s.name:<22}{units.duration(s.wall_p50):>10}{units.duration(s.wall_p90):>10}"
                f"{units.size(s.bytes_in_mean):>12}{units.size(s.bytes_out_mean):>12}{infl:>11}"
            )
        p = f.profile
        out.append(f"  per-sample time p50 {units.duration(p.total_p50)}, p90 {units.duration(p.total_p90)}, "
                   f"p99 {units.duration(p.total_p99)}, max {units.duration(p.total_max)}")
    out += f.cache_lines
    shown = st.epochs[-3:]
    for k, e in enumerate(shown):
        out.append(epoch_line(e, running=f.running and k == len(shown) - 1))
    return "\n".join(out)


def epoch_line(e: EpochStats, running: bool) -> str:
    """One epoch's numbers; ``running``: its iterator is still open (else an unfinished epoch
    was left part-way: the loop broke out, or raised, and dropped its iterator)."""
    counts = "".join(f", {word} {n} ({why})" for word, n, why in (
        ("failed", e.failed_samples, "raised in the loop"),
        ("moved", e.moved_samples, "to an idle worker"),
        ("retried", e.retried_samples, "their worker died"),
        ("dropped", e.dropped_samples, "drop_last")) if n)
    end = ("" if e.finished else " (running)" if running
           else f" (left part-way, after {e.batches} batches)")
    return (f"epoch {e.epoch}: {e.samples} samples in {e.wall_s:.2f} s ({e.samples_per_s:.1f}/s), "
            f"stall {100 * e.stall_fraction:.0f}% of wall, fast {e.fast_samples} / slow "
            f"{e.slow_samples}, skipped {e.skipped_samples}{counts}, main-process CPU "
            f"{e.main_cpu_per_batch_ms:.2f} ms/batch{end}")
