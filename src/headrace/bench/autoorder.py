"""Pecan Figure 3 in one run: AutoOrder's per-worker throughput gain, and profiling's overhead.

``python -m headrace.bench.autoorder [--images N] [--workers W] [--repeats R] [--out DIR]``

**AutoOrder.** An image pipeline declared as in Pecan's ResNet50 example (Figure 3a): Decode,
then the random augmentations Flip, Rotate and Shear (``random=True``), then Resize (shorter
side 256, center crop 224; declared ``commutes=True``) *last*, then ToTensor, on generated
OpenImages-like JPEGs (longer side median 960 px; ``--like imagenet``: 520 px). Three loaders
with the same worker budget, each a ``headrace.DataLoader`` with persistent workers, measured
epoch by epoch, interleaved:

* ``declared``: the pipeline as written (``reorder=False``);
* ``autoorder``: ``pipeline.with_steps(decision.steps)``, where ``decision`` is
  ``autoorder_from_profile`` on the profile of the declared loader's warm-up epoch;
* ``runtime``: the declared pipeline with ``reorder=True`` (the default): the loader applies
  AutoOrder itself from its second epoch (``runtime_matches``: it picked the same order).

The slow-lane hand-off is off in all three (``handoff=False``), so the rows differ by step
order only. Per-worker throughput = samples / epoch wall / workers (Pecan measured 1.4×).

**Profiling overhead.** In-process, per sample: ``SampleRunner(p, measure=sizes.measure,
queued=run_queue_s)`` (what ``Options(profile=True)`` runs in workers on measured samples; the
run-queue clock since 96178c1) vs ``SampleRunner(p)`` (``profile=False``; step
times are taken either way), on the same samples, alternating which goes first. Also the cost
of ``sizes.measure`` timed directly, and the main process's ``Profiler.observe`` per sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import headrace as hr
from headrace.pipeline import Pipeline, step
from headrace.pipeline.runner import SampleRunner, StepTiming
from headrace.planner.autoorder import autoorder_from_profile
from headrace.profiler import sizes
from headrace.profiler.runqueue import run_queue_s
from headrace.profiler.stats import Profiler
from headrace.workloads.images import imagenet_spec, openimages_spec
from headrace.workloads.jpegs import JpegSource, ensure_jpegs
from headrace.workloads.vision import Flip, Resize, decode, to_tensor

Sample = dict[str, Any]
PECAN_RATIO = 1.4
"""Pecan §3.2: the reordered Figure 3 pipeline ran 1.4× faster per worker (n2-standard-8)."""
OBSERVE_SAMPLES = 8192
"""Samples fed to ``Profiler.observe`` to time it (recorded timings, replayed)."""


@dataclasses.dataclass(frozen=True)
class Rotate:
    """Rotate by a random angle in ``[-degrees, degrees]`` (bilinear, same size, black corners)."""

    degrees: float = 30.0

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        from PIL import Image

        angle = float(rng.uniform(-self.degrees, self.degrees))
        im = Image.fromarray(s["image"]).rotate(angle, Image.Resampling.BILINEAR)
        return {**s, "image": np.asarray(im)}


@dataclasses.dataclass(frozen=True)
class Shear:
    """Horizontal shear by a random factor in ``[-max_shear, max_shear]`` (bilinear, same size)."""

    max_shear: float = 0.3

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        from PIL import Image

        k = float(rng.uniform(-self.max_shear, self.max_shear))
        h, w = s["image"].shape[:2]
        im = Image.fromarray(s["image"]).transform(
            (w, h), Image.Transform.AFFINE, (1.0, k, -k * h / 2, 0.0, 1.0, 0.0),
            Image.Resampling.BILINEAR)
        return {**s, "image": np.asarray(im)}


def figure3_pipeline(images: int, seed: int = 0, cache_dir: str | None = None,
                     like: str = "openimages") -> Pipeline:
    """Decode -> Flip -> Rotate -> Shear -> Resize -> ToTensor on ``images`` generated JPEGs.

    ``like``: ``"openimages"`` (longer side median 960 px) or ``"imagenet"`` (median 520 px).
    """
    spec = {"openimages": openimages_spec, "imagenet": imagenet_spec}[like](images, seed)
    root = ensure_jpegs(spec, cache_dir)
    return Pipeline(JpegSource.open(root), [
        step(decode, name="Decode", kind="decode"),
        step(Flip(), name="Flip", random=True, kind="augment"),
        step(Rotate(), name="Rotate", random=True, kind="augment"),
        step(Shear(), name="Shear", random=True, kind="augment"),
        step(Resize(256, 224), name="Resize", commutes=True),
        step(to_tensor, name="ToTensor"),
    ])


# -- per-worker throughput ---------------------------------------------------------------------
def _loader(pipe: Pipeline, args: argparse.Namespace, reorder: bool) -> hr.DataLoader:
    opts = hr.Options(seed=args.seed, reorder=reorder, handoff=False, profile_store=False)
    return hr.DataLoader(pipe, batch_size=args.batch_size, shuffle=True,
                         num_workers=args.workers, persistent_workers=True, options=opts)


def _epoch(loader: hr.DataLoader, workers: int) -> dict[str, float]:
    """One epoch: wall (s), samples/s per worker, mean per-sample step time in workers (s)."""
    costs: list[float] = []
    loader.add_sample_listener(lambda _i, s, _slow: costs.append(s))
    t0 = time.perf_counter()
    n = sum(len(b["index"]) for b in loader)
    wall = time.perf_counter() - t0
    loader.monitor.sample_listeners.pop()  # this epoch's listener only
    return {"wall_s": wall, "per_worker_sps": n / wall / workers,
            "step_s": statistics.fmean(costs) if costs else float("nan")}


def run_autoorder(pipe: Pipeline, args: argparse.Namespace, log: Callable[[str], None]
                  ) -> dict[str, Any]:
    """Warm up, decide, then ``args.repeats`` interleaved epochs of the three loaders."""
    declared = _loader(pipe, args, reorder=False)
    _epoch(declared, args.workers)  # warm-up: worker start, page cache, the profile
    assert declared.planning is not None  # a Pipeline always has a planning
    profile = declared.planning.profile()
    assert profile is not None
    decision = autoorder_from_profile(pipe.steps, profile)
    reordered = _loader(pipe.with_steps(decision.steps), args, reorder=False)
    runtime = _loader(pipe, args, reorder=True)
    _epoch(reordered, args.workers)
    _epoch(runtime, args.workers)  # epoch 0: declared order, profiled
    _epoch(runtime, args.workers)  # epoch 1: AutoOrder applied, workers restarted
    assert runtime.planning is not None
    runtime_order = tuple(s.name for s in runtime.planning.executed.steps)
    loaders = {"declared": declared, "autoorder": reordered, "runtime": runtime}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in loaders}
    for r in range(args.repeats):
        names = list(loaders) if r % 2 == 0 else list(reversed(loaders))
        for name in names:
            runs[name].append(_epoch(loaders[name], args.workers))
        log(f"repeat {r + 1}/{args.repeats}: " + ", ".join(
            f"{k} {runs[k][-1]['per_worker_sps']:.1f}" for k in loaders) + " samples/s/worker")
    for ld in loaders.values():
        ld.close()
    rows = {k: _summary(v) for k, v in runs.items()}
    base = rows["declared"]["per_worker_sps"]["median"]
    ratios = [a["per_worker_sps"] / d["per_worker_sps"]
              for a, d in zip(runs["autoorder"], runs["declared"], strict=True)]
    return {
        "declared_order": [s.name for s in pipe.steps],
        "autoorder_order": list(decision.names),
        "runtime_order": list(runtime_order),
        "runtime_matches": runtime_order == decision.names,
        "decision": decision.explain(),
        "expected_cpu_s": [decision.cpu_before, decision.cpu_after],
        "profile": [{"step": s.name, "wall_p50_s": s.wall_p50, "bytes_in": s.bytes_in_mean,
                     "bytes_out": s.bytes_out_mean, "inflation": s.inflation}
                    for s in profile.steps],
        "rows": rows,
        "ratio_of_medians": {k: rows[k]["per_worker_sps"]["median"] / base for k in rows},
        "paired_ratio": _spread(ratios),
        "runs": runs,
    }


def _spread(xs: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _summary(runs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {k: _spread([r[k] for r in runs]) for k in runs[0]}


# -- profiling overhead ------------------------------------------------------------------------
class _TimedMeasure:
    """``sizes.measure`` with its own cost added up (seconds, calls)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def __call__(self, x: Any) -> Any:
        t0 = time.perf_counter()
        out = sizes.measure(x)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


def run_overhead(name: str, pipe: Pipeline, samples: int, rounds: int) -> dict[str, Any]:
    """Per-sample time with and without ``measure`` on the same samples, interleaved."""
    on, off = SampleRunner(pipe, measure=sizes.measure, queued=run_queue_s), SampleRunner(pipe)
    indices = list(range(min(samples, len(pipe))))
    t_on: list[float] = []
    t_off: list[float] = []
    kept: list[list[StepTiming]] = []
    for r in range(rounds):
        for k, i in enumerate(indices):
            order = (on, off) if (r + k) % 2 == 0 else (off, on)
            for runner in order:
                t0 = time.perf_counter()
                out = runner.run(i, 0, None, base_seed=0, epoch=r)
                dt = time.perf_counter() - t0
                if out.error is not None:
                    raise out.error[1]
                (t_on if runner is on else t_off).append(dt)
                if runner is on:
                    kept.append(out.timings)
    timed = _TimedMeasure()
    direct = SampleRunner(pipe, measure=timed)
    for r in range(rounds):  # in context: right after each step, caches as the step left them
        for i in indices:
            direct.run(i, 0, None, base_seed=0, epoch=r)
    prof, feed = Profiler(pipe.step_names), kept * -(-OBSERVE_SAMPLES // len(kept))
    t0 = time.perf_counter()
    for tm in feed:  # what the main process does per finished sample (flushes included)
        prof.observe(tm, [t.bytes_out for t in tm], 0, [t.changed for t in tm],
                     [t.reshaped for t in tm])
    t1 = time.perf_counter()
    prof.report()
    observe_s, report_s = (t1 - t0) / len(feed), time.perf_counter() - t1
    med_off, med_on = statistics.median(t_off), statistics.median(t_on)
    diffs = [a - b for a, b in zip(t_on, t_off, strict=True)]
    measure_s = timed.seconds / (len(indices) * rounds)
    return {
        "pipeline": name, "steps": len(pipe.step_names), "pairs": len(diffs),
        "median_off_s": med_off, "median_on_s": med_on,
        "median_paired_diff_s": statistics.median(diffs),
        "paired_overhead_pct": 100 * statistics.median(diffs) / med_off,
        "measure_s_per_sample": measure_s, "measure_pct": 100 * measure_s / med_off,
        "observe_s_per_sample": observe_s, "observe_pct": 100 * observe_s / med_off,
        "report_s": report_s,
    }


# -- report ------------------------------------------------------------------------------------
def markdown(result: dict[str, Any]) -> str:
    """The two tables and the decision, as Markdown."""
    a, cfg = result["autoorder"], result["config"]
    lines = [
        f"AutoOrder on Pecan's Figure 3 pipeline: {cfg['images']} {cfg['like']}-like JPEGs, "
        f"{cfg['workers']} worker{'s' if cfg['workers'] != 1 else ''}, "
        f"batch {cfg['batch_size']}, {cfg['repeats']} interleaved epochs per loader "
        "(median, min-max)", "",
        "| loader | step order | samples/s per worker | epoch wall (s) | per-sample step time "
        "(ms) | × declared |",
        "|---|---|---|---|---|---|",
    ]
    orders = {"declared": a["declared_order"], "autoorder": a["autoorder_order"],
              "runtime": a["runtime_order"]}
    for k, row in a["rows"].items():
        t, w, c = row["per_worker_sps"], row["wall_s"], row["step_s"]
        lines.append(
            f"| {k} | {' → '.join(orders[k])} | {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f})"
            f" | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | {1e3 * c['median']:.1f} "
            f"({1e3 * c['min']:.1f}-{1e3 * c['max']:.1f}) | {a['ratio_of_medians'][k]:.2f} |")
    if not a["runtime_matches"]:
        lines.append("| **note** | the loader's own AutoOrder chose another order than "
                     "`autoorder_from_profile` | | | | |")
    p = a["paired_ratio"]
    lines += ["", f"AutoOrder / declared, per repeat: median {p['median']:.2f}× "
              f"(min {p['min']:.2f}, max {p['max']:.2f}); Pecan measured {PECAN_RATIO}×.", "",
              "```", *a["decision"], "```", "",
              "Profiling overhead per sample, in-process (`SampleRunner` with vs without "
              "`sizes.measure`, same samples, interleaved; medians):", "",
              "| pipeline | steps | pairs | profile=False (ms) | profile=True (ms) | "
              "paired diff | measure() direct | Profiler.observe (main process) |",
              "|---|---|---|---|---|---|---|---|"]
    for o in result["overhead"]:
        lines.append(
            f"| {o['pipeline']} | {o['steps']} | {o['pairs']} | {1e3 * o['median_off_s']:.2f} | "
            f"{1e3 * o['median_on_s']:.2f} | {1e6 * o['median_paired_diff_s']:+.0f} µs "
            f"({o['paired_overhead_pct']:+.2f}%) | {1e6 * o['measure_s_per_sample']:.0f} µs "
            f"({o['measure_pct']:.2f}%) | {1e6 * o['observe_s_per_sample']:.1f} µs "
            f"({o['observe_pct']:.2f}%) |")
    return "\n".join(lines) + "\n"


def _machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "loadavg_1m": os.getloadavg()[0]}


def main(argv: Sequence[str] | None = None) -> int:
    """Run both measurements; Markdown to stdout, ``autoorder.json`` and ``.md`` to ``--out``."""
    p = argparse.ArgumentParser(prog="python -m headrace.bench.autoorder",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=128, help="generated JPEGs (default 128)")
    p.add_argument("--like", choices=("openimages", "imagenet"), default="openimages",
                   help="image sizes: longer side median 960 px (default) or 520 px")
    p.add_argument("--workers", type=int, default=2, help="workers of every loader (default 2)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7, help="measured epochs per loader")
    p.add_argument("--overhead-samples", type=int, default=32, help="distinct samples timed")
    p.add_argument("--overhead-rounds", type=int, default=5, help="passes over them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=None, help="where generated JPEGs are kept")
    p.add_argument("--out", default="bench-out/autoorder", metavar="DIR")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    pipe = figure3_pipeline(args.images, args.seed, args.cache_dir, args.like)
    start = _machine()
    log(f"AutoOrder: {args.images} images, {args.workers} workers, {args.repeats} repeats")
    auto = run_autoorder(pipe, args, log)
    from headrace.workloads import get_workload

    imseg = get_workload("imseg", num_samples=args.overhead_samples, seed=args.seed).pipeline
    overhead = []
    for name, pl in (("figure3 declared", pipe),
                     ("figure3 autoorder", pipe.with_steps(_steps(pipe, auto["autoorder_order"]))),
                     ("imseg", imseg)):
        log(f"overhead: {name}")
        overhead.append(run_overhead(name, pl, args.overhead_samples, args.overhead_rounds))
    result = {
        "command": "python -m headrace.bench.autoorder " + " ".join(map(shlex.quote, argv)),
        "machine": {**start, "loadavg_1m_end": os.getloadavg()[0]},
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "autoorder": auto, "overhead": overhead,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(result)
    (out / "autoorder.json").write_text(json.dumps(result, indent=1))
    (out / "autoorder.md").write_text(md)
    print(md)
    log(f"wrote {out / 'autoorder.json'} and {out / 'autoorder.md'}")
    return 0


def _steps(pipe: Pipeline, names: Sequence[str]) -> list[Any]:
    by_name = {s.name: s for s in pipe.steps}
    return [by_name[n] for n in names]


if __name__ == "__main__":
    sys.exit(main())
