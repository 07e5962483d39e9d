"""``headrace profile`` and ``headrace plan``: measure a pipeline, show what headrace decides.

Both take ``SCRIPT_OR_WORKLOAD``: a workload name (``headrace.workloads.WORKLOADS``) or the path
of a Python script. ``register(subparsers)`` adds both to an ``argparse`` parser;
``run_profile(args)`` / ``run_plan(args)`` run them and return the exit status.

Script protocol: the script is imported as a module named after its file (its directory goes on
``sys.path`` so worker processes can import it too; ``if __name__ == "__main__":`` blocks do not
run). At module level it defines ``pipeline`` (a :class:`headrace.Pipeline`) or ``dataset`` (a
map-style dataset; a Compose-like ``transform`` is split into steps); optionally ``batch_size``
(default 32), ``num_workers`` (default 2) and ``collate_fn``, as for ``headrace.DataLoader``; and
optionally ``train_step(batch)``, one training iteration, used for the input-bound vs
accelerator-bound verdict (skipped without it). A workload's consumer sleeps its
``accelerator_step_s`` per batch instead.

``profile`` runs one epoch of ``--samples`` samples (a seeded random subset; a workload is built
with exactly that many) with profiling on, consumed by ``train_step``, then replays one cached
batch (FastFlow's probe, :mod:`headrace.profiler.probe`). It prints the per-step table, the
per-sample time distribution with the slow threshold (the learned hand-off timeout) marked, the
verdict and the step order AutoOrder picks for the next epoch, and writes ``profile-<name>.png``
and ``.json`` into ``--out``. ``plan`` runs ``--epochs`` epochs (2: AutoOrder acts from the
second) and prints ``loader.explain()``. Neither touches a profile store without ``--store``.

Exit status: 0 done; 2 a usage error, or a target that is neither a workload nor a script
that follows the protocol (one line saying what to change); 1 an error of the user's own code
(its traceback: on import as ``python script.py`` prints it, then a line naming the command).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from headrace import units
from headrace.cli.profile_render import histogram_text, step_table, write_png
from headrace.planner.order import MIN_PROFILE_SAMPLES
from headrace.runtime.explaining import handoff_off

DEFAULT_SAMPLES = MIN_PROFILE_SAMPLES
"""Samples per epoch: Pecan's AutoOrder decides from the first ~300 profiled samples."""
DEFAULT_BATCH_SIZE = 32
"""Batch size of a script that does not define ``batch_size``."""
DEFAULT_WORKERS = 2
"""Worker processes for a script that does not define ``num_workers``."""


class TargetError(ValueError):
    """``SCRIPT_OR_WORKLOAD`` cannot be run: neither a script nor a workload, or a script that
    breaks the protocol (module docstring). The message says what to change; the command
    prints it on one line and exits with status 2. An exception the user's script raises
    itself is never one: it keeps its type and traceback (:class:`ScriptFailed`)."""


class ScriptFailed(Exception):
    """The user's script raised ``__cause__`` while being imported. Its traceback starts at
    the script's own frame (headrace's and importlib's frames removed), so printing
    ``__cause__`` shows what ``python script.py`` shows."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What to run: ``dataset`` (a Pipeline or map-style dataset), the ``DataLoader`` arguments,
    ``train_step(batch)`` (``None``: no verdict); ``name`` names the output files."""

    name: str
    dataset: Any
    batch_size: int
    num_workers: int | str  # or "auto"
    collate_fn: Callable[[Any], Any] | None
    train_step: Callable[[Any], Any] | None
    description: str


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``profile`` and ``plan`` subcommands (each sets ``func`` to its runner)."""
    p = subparsers.add_parser(
        "profile", help="per-step profile, per-sample time distribution, input-bound verdict",
        description="Run one epoch with profiling on; print per-step times and bytes, the "
        "per-sample time distribution with the slow threshold, and whether training is "
        "input-bound (FastFlow's Lthp vs Gthp); write a PNG of the distribution.")
    _common(p)
    p.add_argument("--out", default="profile-out", metavar="DIR", help="PNG and JSON go here")
    p.add_argument("--warmup", type=_non_negative, default=3, metavar="N",
                   help="batches consumed before the throughput clock starts (default 3)")
    p.set_defaults(func=run_profile)
    q = subparsers.add_parser(
        "plan", help="run a few epochs and print what headrace decided and why",
        description="Run --epochs epochs (AutoOrder acts from the second) and print "
        "loader.explain(): step order, slow lane, workers, profile.")
    _common(q)
    q.add_argument("--epochs", type=_positive, default=2, metavar="N",
                   help="epochs to run (default 2)")
    q.set_defaults(func=run_plan)


def _common(p: argparse.ArgumentParser) -> None:
    from headrace.workloads import WORKLOADS

    p.add_argument("target", metavar="SCRIPT_OR_WORKLOAD",
                   help=f"a Python script (see headrace.cli.profile) or one of "
                   f"{', '.join(WORKLOADS)}")
    p.add_argument("--samples", type=_positive, default=DEFAULT_SAMPLES, metavar="N",
                   help=f"samples per epoch (default {DEFAULT_SAMPLES}): a workload is built "
                   "with N, a script's dataset gives a seeded random N of its own (all of "
                   "them if it has fewer)")
    p.add_argument("--workers", type=_non_negative, default=None, metavar="N",
                   help="worker processes, 0: load in this process (default: the script's "
                   "or workload's)")
    p.add_argument("--batch-size", type=_positive, default=None, metavar="N",
                   help="batch size (default: the script's or workload's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample subset and steps")
    p.add_argument("--time-scale", type=_non_negative_float, default=0.1, metavar="F",
                   help="workloads: factor on simulated step times (default 0.1)")
    p.add_argument("--cache-dir", default=None, help="workloads: where generated files go")
    p.add_argument("--store", default=None, metavar="PATH",
                   help="profile store (SQLite) to reuse and update (default: none)")


def _positive(text: str) -> int:
    """An argparse type: an integer of at least 1 (``--batch-size 0`` was taken for the
    default, ``--samples 0`` profiled one sample)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _non_negative(text: str) -> int:
    """An argparse type: an integer of at least 0 (``--workers -1`` ended in torch's
    traceback)."""
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {n}")
    return n


def _non_negative_float(text: str) -> float:
    """An argparse type: a finite number of at least 0 (a factor on step times)."""
    x = float(text)
    if not (math.isfinite(x) and x >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of at least 0, got {text}")
    return x


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
    finally:
        loader.close()
    wall = time.perf_counter() - t0
    times, slow = [t for t, _ in seen], [s for _, s in seen]
    profile = loader.planning.profile() if loader.planning is not None else None
    if profile is None or not times:
        print(f"headrace profile: no sample of {target.name} was profiled", file=sys.stderr)
        return 1
    threshold, what = _threshold(loader, times)
    off = handoff_off(loader) if loader.pipeline is not None else ""  # as explain() says
    n, above = len(times), sum(t > threshold for t in times)
    out = [
        f"headrace profile: {target.name}: {target.description}",
        f"{n} samples, batch {loader.batch_size}, {loader.num_workers} workers, "
        f"{wall:.2f} s ({n / wall:.1f} samples/s with the consumer)",
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
    finally:
        loader.close()
    print(loader.explain())
    need = min(MIN_PROFILE_SAMPLES, len(target.dataset))
    if len(loader.sampler) < need:
        print(f"note: AutoOrder decides after {need} profiled samples; this ran "
              f"{len(loader.sampler)} per epoch (use --samples {need})")
    return 0


# -- targets ----------------------------------------------------------------------------------
def load_target(spec: str, *, samples: int, time_scale: float = 0.1,
                cache_dir: str | None = None, seed: int = 0) -> Target:
    """A workload by name (built with ``samples`` samples) or a script by path.

    Raises :class:`TargetError` with what to do when ``spec`` is neither, or the script breaks
    the protocol (module docstring); :class:`ScriptFailed` when the script raises on import.
    """
    from headrace.workloads import WORKLOADS, get_workload

    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise TargetError(f"no script at {spec}")
        return _script_target(load_script(path))
    if spec not in WORKLOADS:
        raise TargetError(f"{spec!r} is neither a Python script nor a workload "
                         f"({', '.join(WORKLOADS)})")
    try:
        w = get_workload(spec, num_samples=samples, time_scale=time_scale, seed=seed,
                         cache_dir=cache_dir)
    except ValueError as e:  # a workload's own check of these arguments
        raise TargetError(f"{spec}: {e}") from None
    step_s = w.accelerator_step_s
    return Target(w.name, w.pipeline, w.batch_size, w.num_workers, None,
                  lambda _batch: time.sleep(step_s),
                  f"{w.description} (consumer: a {step_s * 1e3:g} ms sleep per batch)")


def load_script(path: str | Path) -> ModuleType:
    """Import the script at ``path`` as a module named after it, not as ``__main__``.

    Its directory is put first on ``sys.path`` so that spawned worker processes can import it
    (its functions are pickled by reference); a name taken by another module gets a prefix.
    An exception the script raises is re-raised as :class:`ScriptFailed` from it (its
    ``__cause__``, traceback from the script's frame on); ``SystemExit`` and
    ``KeyboardInterrupt`` pass as they are, as they would end ``python script.py``.
    """
    p = Path(path).resolve()
    name = p.stem
    taken = sys.modules.get(name)
    if not name.isidentifier() or (taken is not None and getattr(taken, "__file__", None) != str(p)):
        name = "_headrace_script_" + "".join(c if c.isalnum() else "_" for c in p.stem)
    if str(p.parent) not in sys.path:
        sys.path.insert(0, str(p.parent))
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {p} as a Python module")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's own error, of any type (a ValueError included)
        del sys.modules[name]
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != str(p):
            tb = tb.tb_next  # drop this function's frame and importlib's
        if tb is not None:
            e.__traceback__ = tb
        raise ScriptFailed(f"{p} raised while being imported") from e
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _script_target(m: ModuleType) -> Target:
    import headrace as hr

    where = getattr(m, "__file__", m.__name__)
    data = getattr(m, "pipeline", None)
    if data is not None and not isinstance(data, hr.Pipeline):
        raise TargetError(f"{where}: `pipeline` must be a headrace.Pipeline, "
                         f"got {type(data).__name__}")
    if data is None:
        import torch.utils.data as tud

        data = getattr(m, "dataset", None)
        if isinstance(data, tud.IterableDataset):
            raise TargetError(f"{where}: `dataset` is an IterableDataset; profile and plan "
                             "run a subset of samples by index, which needs a map-style "
                             "dataset (__len__ and __getitem__)")
        if data is None or not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise TargetError(f"{where}: define `pipeline` (a headrace.Pipeline) or `dataset` "
                             "(a map-style dataset with __len__ and __getitem__)")
    step = getattr(m, "train_step", None)
    if step is not None and not callable(step):
        raise TargetError(f"{where}: `train_step` must be callable as train_step(batch)")
    return Target(
        name=m.__name__.removeprefix("_headrace_script_"),
        dataset=data,
        batch_size=_count(getattr(m, "batch_size", DEFAULT_BATCH_SIZE), "batch_size", 1, where),
        num_workers=_workers(getattr(m, "num_workers", DEFAULT_WORKERS), where),
        collate_fn=getattr(m, "collate_fn", None),
        train_step=step,
        description=f"script {where}" + ("" if step else " (no train_step)"),
    )


def _workers(value: Any, where: str) -> int | str:
    """A script's ``num_workers``: an integer of at least 0, or ``"auto"`` as the DataLoader
    takes it."""
    if value == "auto":
        return "auto"
    return _count(value, "num_workers", 0, where, " or 'auto'")


def _count(value: Any, name: str, least: int, where: str, other: str = "") -> int:
    """A script's integer setting ``name`` of at least ``least``, else a :class:`TargetError`
    naming it (not int()'s message, nor torch's traceback for a negative one)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = least - 1
    if n < least or isinstance(value, bool):
        raise TargetError(f"{where}: `{name}` must be an integer of at least {least}{other}, "
                          f"got {value!r}")
    return n


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
    opts = hr.Options(seed=args.seed, profile=True,
                      profile_store=args.store if args.store else False)
    return hr.DataLoader(
        target.dataset,
        batch_size=target.batch_size if args.batch_size is None else args.batch_size,
        sampler=order.tolist(),
        num_workers=target.num_workers if args.workers is None else args.workers,
        collate_fn=target.collate_fn,
        options=opts,
    )
