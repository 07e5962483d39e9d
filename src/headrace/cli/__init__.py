"""The ``headrace`` command: ``bench``, ``cachebench``, ``demo``, ``profile``, ``plan``, ``train``.

Each subcommand is one ``_add_<name>(subparsers)`` function that declares its arguments and
sets ``func`` to the function running it; adding a subcommand is writing that pair and listing
the adder in :data:`SUBCOMMANDS`. Heavy imports happen inside the run functions, so ``--help``
stays fast. ``python -m headrace.cli`` runs it too (``cli/__main__.py``). ``profile`` and ``plan`` build a loader from a user's script, so they live here
(``cli/profile.py``), beside the command, not in ``profiler/``, which the runtime imports.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Callable, Sequence

from headrace.cli.arg_types import (
    int_at_least,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from headrace.workloads import WORKLOADS


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- bench ------------------------------------------------------------------------------------
def _add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="headrace vs torch DataLoader on the papers' workloads (tables, JSON, PNGs)",
        description="Run every loader on each workload in one process with a simulated "
        "accelerator; report wall time, wall ÷ ideal and ÷ work-conserving bound, stall, "
        "samples/s, peak RSS and CPU-seconds (median and min-max over repeats).",
    )
    p.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                   help=f"workloads to run (default: all of {', '.join(WORKLOADS)})")
    p.add_argument("--quick", action="store_true",
                   help="small scales, one repeat, no torch sweep: a few minutes in all")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output directory (default: bench-out, or bench-out/quick with --quick)")
    p.add_argument("--repeats", type=positive_int, default=None, metavar="N",
                   help="measured epochs per loader after the warm-up (default 3, quick 1)")
    p.add_argument("--scale", type=positive_float, default=1.0,
                   help="factor on the preset number of samples of every workload")
    p.add_argument("--time-scale", type=non_negative_float, default=0.1,
                   help="factor on simulated step times (default 0.1, the papers' 1/10)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="override every workload's worker budget")
    p.add_argument("--no-sweep", action="store_true", help="skip torch's worker/prefetch sweep")
    p.add_argument("--no-plots", action="store_true", help="write JSON and Markdown only")
    p.add_argument("--cache-dir", default=None, help="where generated JPEG sets are kept")
    p.add_argument("--blas-threads", type=non_negative_int, default=None, metavar="N",
                   help="OpenBLAS threads in the benchmark process, inherited by torch's "
                   "workers (default 1; 0: the library's default, one per core, as a user "
                   "has it; headrace's workers take Options(worker_blas_threads) either way)")
    p.add_argument("--update-doc", default=None, metavar="FILE",
                   help="also write the tables into FILE between its headrace-bench markers "
                   "(e.g. docs/benchmarks.md)")
    p.set_defaults(func=_run_bench)


def _doc_problem(doc: str) -> str | None:
    """Why ``--update-doc doc`` could not be written after the run (``None``: it can), checked
    before the run, which takes ~17 minutes in full, rather than after it."""
    from pathlib import Path

    from headrace.bench.report import DOC_BEGIN, DOC_END

    try:
        text = Path(doc).read_text()
    except OSError as e:
        return f"cannot read {doc}: {e.strerror or e}"
    start, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if start < 0 or end < start:
        return f"{doc} has no {DOC_BEGIN} ... {DOC_END} block to replace"
    return None


def _run_bench(args: argparse.Namespace) -> int:
    from headrace.bench import full_config, quick_config, run_and_write

    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        _log(f"headrace bench: unknown workload(s) {', '.join(unknown)}; "
             f"choose from {', '.join(WORKLOADS)}")
        return 2
    problem = _doc_problem(args.update_doc) if args.update_doc else None
    if problem:
        _log(f"headrace bench: --update-doc: {problem}")
        return 2
    preset = quick_config if args.quick else full_config
    overrides: dict[str, object] = {
        "out_dir": args.out or ("bench-out/quick" if args.quick else "bench-out"),
        "time_scale": args.time_scale,
        "num_workers": args.workers,
        "cache_dir": args.cache_dir,
        "plots": not args.no_plots,
    }
    if args.repeats is not None:
        overrides["repeats"] = args.repeats
    if args.blas_threads is not None:
        overrides["blas_threads"] = args.blas_threads
    if args.no_sweep:
        overrides["sweep"] = False
    config = preset(args.workloads, **overrides)
    if args.scale != 1.0:
        scales = {w: config.scale_of(w) * args.scale for w in config.workloads}
        config = dataclasses.replace(config, scales=scales)
    command = "headrace " + " ".join(shlex.quote(a) for a in args.argv)
    _, paths = run_and_write(config, command, _log)
    print(paths["markdown"].read_text())
    if args.update_doc:
        from headrace.bench.report import splice_into_doc

        _log(f"updated {splice_into_doc(args.update_doc, paths['markdown'].read_text(), paths['dir'])}")
    if args.no_plots:
        _log(f"wrote {paths['json']} and {paths['markdown']}")
    else:
        _log(f"wrote {paths['json']}, {paths['markdown']} and PNGs to {paths['dir']}/")
    return 0


# -- demo -------------------------------------------------------------------------------------
def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="train a small CNN on the CPU with torch DataLoader, then headrace; compare",
        description="Generate a small ImageNet-like JPEG set, train a small model for a few "
        "epochs with torch's DataLoader (configured as its docs suggest) and then with "
        "headrace (num_workers=\"auto\"), and print wall time, stall, samples/s, wall ÷ ideal "
        "and cache hits per epoch for both, the reason for the difference, and a plot.",
    )
    p.add_argument("--out", default="demo-out", metavar="DIR", help="plots go here")
    p.add_argument("--steps", type=positive_int, default=30, help="training steps per epoch")
    p.add_argument("--epochs", type=positive_int, default=3, help="epochs per loader")
    p.add_argument("--batch-size", type=positive_int, default=32)
    p.add_argument("--workers", type=non_negative_int, default=None,
                   help="torch's worker processes (default: this machine's cores)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads for the model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from headrace.bench.demo import DemoConfig, run_demo

    run_demo(DemoConfig(out_dir=args.out, steps=args.steps, epochs=args.epochs,
                        batch_size=args.batch_size,
                        workers=args.workers, threads=args.threads,
                        progress=not args.no_progress))
    return 0


CACHEBENCH_EPOCHS_WHY = ("epoch 1 only fills the cache; every row is measured over epochs 2 "
                         "and later")
"""Why ``cachebench --epochs`` is at least 2 (one epoch left nothing to measure: a table of NaN)."""


def _add_cachebench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cachebench",
        help="the sample cache (Seneca) vs torch on imagenet, epochs 2+",
        description="Epochs 2+ on the imagenet workload: torch's best configuration, headrace "
        "without cache, with the decoded set fitting the budget, with 20% fitting, MDP "
        "predicted vs measured, and three concurrent jobs sharing a Redis cache, without and "
        "with ODS (Seneca's opportunistic sampling), beside three torch jobs.",
    )
    p.add_argument("--out", default="cachebench-out", metavar="DIR")
    p.add_argument("--samples", type=positive_int, default=1920,
                   help="samples in the imagenet set")
    p.add_argument("--workers", type=positive_int, default=2,
                   help="worker budget of every loader")
    p.add_argument("--epochs", type=int_at_least(2, CACHEBENCH_EPOCHS_WHY), default=3,
                   help=f"epochs per row, at least 2 ({CACHEBENCH_EPOCHS_WHY})")
    p.add_argument("--redis", default=None, metavar="URL",
                   help="a Redis server for the 3-job rows (default: start a local one)")
    p.add_argument("--no-redis", action="store_true", help="skip the 3-job rows")
    p.add_argument("--jobs-only", action="store_true", help="only the 3-job rows")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="rounds of the 3-job rows, interleaved (medians reported)")
    p.add_argument("--cache-dir", default=None, help="where generated JPEG sets are kept")
    p.set_defaults(func=_run_cachebench)


def _run_cachebench(args: argparse.Namespace) -> int:
    from headrace.bench.cache import run

    if args.jobs_only and args.no_redis:
        raise SystemExit("--jobs-only needs the Redis rows (drop --no-redis)")
    result = run(args.out, args.samples, args.workers, args.epochs, args.redis,
                 not args.no_redis, args.cache_dir, log=_log, jobs_only=args.jobs_only,
                 rounds=args.rounds)
    print((__import__("pathlib").Path(args.out) / "cache_results.md").read_text())
    return crashed_status(result)


def crashed_status(result: dict) -> int:
    """``headrace cachebench``'s exit status: 1 when a concurrent job crashed in any round
    (named in the log and the table, its round left out of the numbers), else 0: a script
    running the benchmark hears of it, where it exited 0 (a review)."""
    return 1 if any(r.get("crashed") for r in result["rows"]) else 0


# -- the command ------------------------------------------------------------------------------
def _add_profile_and_plan(sub: argparse._SubParsersAction) -> None:
    from headrace.cli.profile import register

    register(sub)


# -- train ------------------------------------------------------------------------------------
def _add_train(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a ResNet (imagenet), a 3D U-Net (imseg) or an LSTM encoder (speech) with "
        "torch's DataLoader and headrace: epoch time, loss curve, GPU utilization",
        description="A real training run per workload and loader, same samples and model "
        "initialisation; on CUDA with nvidia-ml-py (headrace[gpu]) GPU utilization is "
        "sampled. Without CUDA it runs tiny models on the CPU.",
    )
    p.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                   help="imagenet, imseg, speech-3s, speech-10s (default: all)")
    p.add_argument("--epochs", type=positive_int, default=2)
    p.add_argument("--scale", type=positive_float, default=1.0,
                   help="factor on samples per epoch")
    p.add_argument("--samples", type=positive_int, default=None,
                   help="exact samples per epoch (replaces --scale)")
    p.add_argument("--workers", type=non_negative_int, default=None,
                   help="worker budget of both loaders")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if present)")
    p.add_argument("--width", type=positive_int, default=None, help="model width (default by device)")
    p.add_argument("--depth", type=positive_int, default=None,
                   help="speech's LSTM layers (default: 5 on CUDA); more layers, a longer step")
    p.add_argument("--blas-threads", type=non_negative_int, default=1,
                   help="OpenBLAS threads of the training process and torch's forked workers "
                   "(default 1, as headrace bench; 0: unchanged, a pool per core per worker)")
    p.add_argument("--no-amp", action="store_true", help="fp32 on CUDA (default: bf16 autocast)")
    p.add_argument("--interval", type=positive_float, default=0.1, help="utilization sampling period, s")
    p.add_argument("--loaders", default="torch,headrace",
                   help="comma-separated, among torch, headrace, headrace-host (headrace "
                   "without Options(device=): the loop copies pinned batches as with torch)")
    p.add_argument("--out", default="train-out", metavar="DIR")
    p.add_argument("--cache-dir", default=None, help="where generated JPEG sets are kept")
    p.set_defaults(func=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    from headrace.bench.train import LOADERS, TRAIN_WORKLOADS, TrainConfig, run_train

    unknown = [w for w in args.workloads if w not in TRAIN_WORKLOADS]
    if unknown:
        _log(f"headrace train: no model for workload(s) {', '.join(unknown)}; "
             f"choose from {', '.join(TRAIN_WORKLOADS)}")
        return 2
    loaders = tuple(args.loaders.split(","))
    unknown = [x for x in loaders if x not in LOADERS]
    if unknown:
        _log(f"headrace train: --loaders: unknown loader(s) {', '.join(unknown)}; "
             f"choose from {', '.join(LOADERS)}")
        return 2
    cfg = TrainConfig(
        workloads=tuple(args.workloads) or TRAIN_WORKLOADS, scale=args.scale,
        samples=args.samples, epochs=args.epochs, workers=args.workers, device=args.device,
        width=args.width, depth=args.depth, amp=not args.no_amp, interval_s=args.interval,
        blas_threads=args.blas_threads, loaders=loaders, out_dir=args.out,
        cache_dir=args.cache_dir,
    )
    run_train(cfg, log=_log)
    _log(f"written: {args.out}/train.json, train.md, train.png")
    return 0


SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_bench,
    _add_cachebench,
    _add_demo,
    _add_profile_and_plan,
    _add_train,
)
"""One adder per subcommand, in ``--help`` order."""


def build_parser() -> argparse.ArgumentParser:
    """The ``headrace`` argument parser with every subcommand."""
    from headrace import __version__

    parser = argparse.ArgumentParser(
        prog="headrace",
        description="headrace keeps accelerators fed: a drop-in torch DataLoader that measures "
        "the input pipeline while it runs.",
    )
    parser.add_argument("--version", action="version", version=f"headrace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``headrace`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return int(args.func(args))

