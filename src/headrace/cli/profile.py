"""``headrace profile`` and ``headrace plan``: measure a pipeline, show what headrace decides.

Both take ``SCRIPT_OR_WORKLOAD``: a workload name (``headrace.workloads.WORKLOADS``) or the path
of a Python script. ``register(subparsers)`` adds both to an ``argparse`` parser;
``run_profile(args)`` / ``run_plan(args)`` run them and return the exit status.

The script protocol (what a script defines) is :mod:`headrace.cli.targets`'s; a workload's
consumer sleeps its ``accelerator_step_s`` per batch.

``profile`` runs one epoch of ``--samples`` samples (a seeded random subset; a workload is built
with exactly that many) with profiling on, consumed by ``train_step``, then replays one cached
batch (FastFlow's probe, :mod:`headrace.profiler.probe`). It prints the per-step table, the
per-sample time distribution with the slow threshold (the learned hand-off timeout) marked, the
verdict and the step order AutoOrder picks for the next epoch, and writes ``profile-<name>.png``
and ``.json`` into ``--out``. ``plan`` runs ``--epochs`` epochs (2: AutoOrder acts from the
second) and prints ``loader.explain()``. Neither touches a profile store without ``--store``.

Exit status: 0 done; 2 a usage error, or a target that is neither a workload nor a script
that follows the protocol (one line saying what to change); 1 an error of the user's own code
(its traceback: on import as ``python script.py`` prints it, then a line naming the command;
in a sample's ``__getitem__`` or step as the loader raises it, then the command's way to skip
such samples: ``--on-error skip``, which ``profile`` reports as "N skipped" and ``plan``'s
``explain()`` per epoch; both exit 1 when no sample reached the training loop, every one
skipped, after saying so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from headrace import units
from headrace.cli.arg_types import non_negative_float, non_negative_int, positive_int
from headrace.cli.profile_render import histogram_text, step_table, write_png
from headrace.cli.targets import ScriptFailed, Target, TargetError, load_target
from headrace.errors import HeadraceError
from headrace.planner.order import MIN_PROFILE_SAMPLES
from headrace.runtime.explaining import handoff_off

DEFAULT_SAMPLES = MIN_PROFILE_SAMPLES
"""Samples per epoch: Pecan's AutoOrder decides from the first ~300 profiled samples."""
def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``profile`` and ``plan`` subcommands (each sets ``func`` to its runner)."""
    p = subparsers.add_parser(
        "profile", help="per-step profile, per-sample time distribution, input-bound verdict",
        description="Run one epoch with profiling on; print per-step times and bytes, the "
        "per-sample time distribution with the slow threshold, and whether training is "
        "input-bound (FastFlow's Lthp vs Gthp; a workload, or a script defining train_step); "
        "write a PNG of the distribution and the numbers as JSON.")
    _common(p)
    p.add_argument("--out", default="profile-out", metavar="DIR",
                   help="PNG and JSON go here (default profile-out)")
    p.add_argument("--warmup", type=non_negative_int, default=3, metavar="N",
                   help="batches consumed before the verdict's throughput clock starts "
                   "(default 3; at most the epoch's batches less one)")
    p.set_defaults(func=run_profile)
    q = subparsers.add_parser(
        "plan", help="run a few epochs and print what headrace decided and why",
        description="Run --epochs epochs (AutoOrder acts from the second) and print "
        "loader.explain(): step order, slow lane, workers, profile.")
    _common(q)
    q.add_argument("--epochs", type=positive_int, default=2, metavar="N",
                   help="epochs to run (default 2)")
    q.set_defaults(func=run_plan)


def _common(p: argparse.ArgumentParser) -> None:
    from headrace.workloads import WORKLOADS

    p.add_argument("target", metavar="SCRIPT_OR_WORKLOAD",
                   help=f"a Python script (see headrace.cli.targets) or one of "
                   f"{', '.join(WORKLOADS)}")
    p.add_argument("--samples", type=positive_int, default=DEFAULT_SAMPLES, metavar="N",
                   help=f"samples per epoch (default {DEFAULT_SAMPLES}): a workload is built "
                   "with N, a script's dataset gives a seeded random N of its own (all of "
                   "them if it has fewer)")
    p.add_argument("--workers", type=non_negative_int, default=None, metavar="N",
                   help="worker processes, 0: load in this process (default: the script's "
                   "or workload's)")
    p.add_argument("--batch-size", type=positive_int, default=None, metavar="N",
                   help="batch size (default: the script's or workload's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample subset and steps")
    p.add_argument("--time-scale", type=non_negative_float, default=0.1, metavar="F",
                   help="workloads: factor on simulated step times (default 0.1)")
    p.add_argument("--cache-dir", default=None, help="workloads: where generated files go")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                   help="a sample whose __getitem__ or step raises: raise (default) stops "
                   "with its traceback; skip drops it and counts it (Options(on_error=...))")
    p.add_argument("--store", default=None, metavar="PATH",
                   help="profile store (SQLite) to reuse and update (default: none)")


def run_profile(args: argparse.Namespace) -> int:
    """``headrace profile``: see the module docstring. Returns the exit status."""
    from headrace.profiler.probe import probe

    target = _target_or_status(args)
    if isinstance(target, int):
        return target
    loader = _loader(target, args)
    seen: list[tuple[float, bool]] = []  # (seconds, went slow) per finished sample
    loader.add_sample_listener(lambda _i, seconds, went_slow: seen.append((seconds, went_slow)))
    t0, result = time.perf_counter(), None
    try:
        if target.train_step is not None:
            warmup = max(0, min(args.warmup, len(loader) - 1))
            result = probe(loader, target.train_step, batches=None, warmup=warmup)
        else:
            for _ in loader:
                pass
    except HeadraceError as e:
        if not _said_on_error(e, args):
            raise
        return 1
    finally:
        loader.close()
    wall = time.perf_counter() - t0
    times, slow = [t for t, _ in seen], [s for _, s in seen]
    profile = loader.planning.profile() if loader.planning is not None else None
    if profile is None or not times:
        print(f"headrace profile: no sample of {target.name} was profiled"
              + _all_skipped(loader), file=sys.stderr)
        return 1
    threshold, what = _threshold(loader, times)
    off = handoff_off(loader) if loader.pipeline is not None else ""  # as explain() says
    n, above = len(times), sum(t > threshold for t in times)
    out = [
        f"headrace profile: {target.name}: {target.description}",
        f"{n} samples, batch {loader.batch_size}, {loader.num_workers} workers, "
        f"{wall:.2f} s ({n / wall:.1f} samples/s with the consumer)"
        + _skipped(loader),
        "", "per step, per sample (load = Source.load):", *step_table(profile), "",
        f"per-sample time (load + steps), {n} samples: p50 {units.duration(profile.total_p50)}, "
        f"p90 {units.duration(profile.total_p90)}, p99 {units.duration(profile.total_p99)}, max {units.duration(profile.total_max)}",
        *histogram_text(times, threshold),
        f"slow threshold {units.duration(threshold)} ({what}): {above} of {n} samples above it; "
        + (f"{sum(slow)} went through the slow lane" if not off else f"slow lane: off ({off})"),
        "", "verdict: " + (result.describe() if result is not None
                           else "skipped (the script defines no train_step)"),
    ]
    plan = loader.planning.decide() if loader.planning is not None else None
    if plan is not None:  # the loader's own plan, as explain() gives it
        out += ["", "step order for the next epoch:", *(f"  {x}" for x in plan.lines())]
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    png = write_png(times, threshold, what, outdir / f"profile-{target.name}.png",
                    f"headrace profile: {target.name} ({n} samples)")
    js = outdir / f"profile-{target.name}.json"
    js.write_text(json.dumps({
        "target": target.name, "samples": n, "wall_s": wall, "threshold_s": threshold,
        "threshold_basis": what, "sample_times_s": times, "slow": slow,
        "probe": dataclasses.asdict(result) if result is not None else None,
        "profile": profile.to_dict()}, indent=1))
    print("\n".join([*out, "", f"wrote {png} and {js}"]))
    return 0


def _threshold(loader: Any, times: Sequence[float]) -> tuple[float, str]:
    """The slow threshold in seconds (the loader's learned timeout) and what it is."""
    stats, cfg = loader.stats(), loader.options.timeout
    if math.isfinite(stats.timeout_s):
        if math.isnan(stats.timeout_percentile):  # TimeoutConfig(fixed_s=...): not learned
            return stats.timeout_s, "the hand-off timeout fixed by TimeoutConfig(fixed_s=...)"
        return stats.timeout_s, (f"the learned hand-off timeout at the end, "
                                 f"p{stats.timeout_percentile:g} of per-sample time")
    return float(np.percentile(times, cfg.percentile)), (
        f"p{cfg.percentile:g} of these samples; the loader sets its timeout after "
        f"{cfg.warmup_samples} samples")


def run_plan(args: argparse.Namespace) -> int:
    """``headrace plan``: run ``--epochs`` epochs, print ``loader.explain()``. Exit status."""
    target = _target_or_status(args)
    if isinstance(target, int):
        return target
    loader = _loader(target, args)
    try:
        for _ in range(args.epochs):
            for _ in loader:
                pass
    except HeadraceError as e:
        if not _said_on_error(e, args):
            raise
        return 1
    finally:
        loader.close()
    print(loader.explain())  # its epoch lines count skipped samples
    if not sum(e.samples for e in loader.stats().epochs):  # as profile: nothing was measured
        print(f"headrace plan: no sample of {target.name} reached the training loop"
              + _all_skipped(loader), file=sys.stderr)
        return 1
    need = min(MIN_PROFILE_SAMPLES, len(target.dataset))
    if len(loader.sampler) < need:
        print(f"note: AutoOrder decides after {need} profiled samples; this ran "
              f"{len(loader.sampler)} per epoch (use --samples {need})")
    return 0


def _said_on_error(e: HeadraceError, args: argparse.Namespace) -> bool:
    """Print ``e`` with its traceback and the command's way to skip failing samples, where its
    message advises ``Options(on_error='skip')``, which a user of the command cannot pass
    (a failing step or ``__getitem__``, a sample that kills its worker). False: ``e`` is not
    such an error, or the command already ran with ``--on-error skip``; let it propagate."""
    if args.on_error != "raise" or "Options(on_error='skip')" not in str(e):
        return False
    traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
    print(f"headrace {getattr(args, 'command', 'profile')}: the command's way to do so is "
          "--on-error skip (it reports how many samples it skipped)", file=sys.stderr)
    return True


def _all_skipped(loader: Any) -> str:
    """``": every sample was skipped (N, --on-error skip)"`` where samples were skipped, else
    ``""``: the end of the line that says no sample was delivered."""
    n = sum(e.skipped_samples for e in loader.stats().epochs)
    return f": every sample was skipped ({n}, --on-error skip)" if n else ""


def _skipped(loader: Any) -> str:
    """``", N skipped (--on-error skip)"`` where samples were skipped, else ``""``."""
    n = sum(e.skipped_samples for e in loader.stats().epochs)
    return f", {n} skipped (--on-error skip)" if n else ""


# -- targets ----------------------------------------------------------------------------------
def _target_or_status(args: argparse.Namespace) -> Target | int:
    """The target, or the exit status after saying why there is none: 2 for a
    :class:`TargetError` (one line), 1 for a script that raised on import (its traceback, as
    ``python script.py`` prints it, then one line naming the command)."""
    command = f"headrace {getattr(args, 'command', 'profile')}"
    try:
        return load_target(args.target, samples=args.samples, time_scale=args.time_scale,
                           cache_dir=args.cache_dir, seed=args.seed)
    except TargetError as e:
        print(f"{command}: {e}", file=sys.stderr)
        return 2
    except ScriptFailed as e:
        cause = e.__cause__ or e
        traceback.print_exception(type(cause), cause, cause.__traceback__, file=sys.stderr)
        print(f"{command}: {e}", file=sys.stderr)
        return 1


def _loader(target: Target, args: argparse.Namespace) -> Any:
    """A profiling ``headrace.DataLoader`` over a seeded random subset of ``args.samples``."""
    import torch

    import headrace as hr

    total = len(target.dataset)
    n = min(args.samples, total)
    order = torch.randperm(total, generator=torch.Generator().manual_seed(args.seed))[:n]
    opts = hr.Options(seed=args.seed, profile=True, on_error=args.on_error,
                      profile_store=args.store if args.store else False)
    return hr.DataLoader(
        target.dataset,
        batch_size=target.batch_size if args.batch_size is None else args.batch_size,
        sampler=order.tolist(),
        num_workers=target.num_workers if args.workers is None else args.workers,
        collate_fn=target.collate_fn,
        options=opts,
    )
