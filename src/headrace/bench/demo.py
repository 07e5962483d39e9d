"""``headrace demo``: train a small model on the CPU for a few epochs with torch's DataLoader,
then with headrace, and say in one look which was faster and why.

The dataset is a generated ImageNet-like JPEG set (``headrace.workloads``, class = image tint,
so the model visibly learns). torch's loader is configured as its documentation suggests for a
multi-epoch job (``num_workers`` = this machine's cores, ``persistent_workers=True``, prefetch 2);
headrace gets ``num_workers="auto"`` and its defaults (the sample cache is on). Both get the same
sampler order every epoch and the same model initialisation; the training step runs in the
consumer loop of the benchmark harness (``bench/measure.run_epochs``), so the comparison uses
the same measurements as ``headrace bench`` (wall, stall, samples/s, wall ÷ ideal with the mean
measured training step as the consumer step). headrace starts cold (no stored profile), as on a
first run, so the demo is repeatable.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from headrace import units
from headrace.bench import write_outputs
from headrace.bench.config import BenchConfig, LoaderSpec
from headrace.bench.measure import RunRecord, run_epochs
from headrace.bench.runner import BenchResult, WorkloadResult, machine_info, sampler_order
from headrace.bench.summary import summarize
from headrace.planner.workers import available_cpus
from headrace.runtime import Options
from headrace.runtime.native_threads import blas_limited
from headrace.workloads import Workload, imagenet_workload


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Settings of ``headrace demo``.

    Attributes:
        out_dir: where the plot, ``results.json`` and ``results.md`` go.
        steps: training steps (batches) per epoch: an epoch is ``steps × batch_size`` images.
        epochs: epochs per loader (one loader instance each, as a training job).
        batch_size: images per batch.
        workers: torch's worker processes (``None``: this machine's cores, as torch's docs
            suggest); also the worker budget of headrace's yardsticks.
        threads: torch intra-op threads for the model in the training process.
        seed: dataset, sampler order and model initialisation seed.
        cache_dir: where the generated JPEGs live (``None``: the workloads' default).
        progress: show a tqdm progress bar per loader.
    """

    out_dir: str = "demo-out"
    steps: int = 30
    epochs: int = 3
    batch_size: int = 32
    workers: int | None = None
    threads: int = 1
    seed: int = 0
    cache_dir: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "epochs", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.workers is not None and self.workers < 0:
            raise ValueError(f"workers must be at least 0, got {self.workers}")


class TinyNet(nn.Module):
    """A small CNN for 224 × 224 RGB images: 4× average-pool, two strided convs, a linear head."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.AvgPool2d(4),
            nn.Conv2d(3, 16, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _trainer(seed: int, bar: Any) -> tuple[Callable[[Any], None], list[float]]:
    """A fresh model (same init for every loader) and its training step on one batch."""
    torch.manual_seed(seed)
    model = TinyNet()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses: list[float] = []

    def step(batch: Any) -> None:
        x = torch.as_tensor(batch["image"])
        y = torch.as_tensor(batch["label"])
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)

    return step, losses


def _train(
    wl: Workload, spec: LoaderSpec, order: list[int], cfg: DemoConfig
) -> tuple[list[RunRecord], list[float]]:
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=wl.num_batches * cfg.epochs, desc=f"{spec.label:<18}", unit="batch",
                   file=sys.stderr)
    step, losses = _trainer(cfg.seed, bar)
    try:
        # cold start, as on a first run: no stored profile from earlier demos
        records = run_epochs(wl, spec, order, cfg.epochs, consume=step,
                             options=Options(profile_store=False))
    finally:
        if bar is not None:
            bar.close()
    return records, losses


def _reason(torch_runs: list[RunRecord], hr_runs: list[RunRecord]) -> str:
    """One sentence, from the run's numbers, on where the difference comes from."""
    later_t = [r.wall_s for r in torch_runs[1:]]
    later_h = [r.wall_s for r in hr_runs[1:]]
    caches = [r.headrace.cache for r in hr_runs[1:] if r.headrace and r.headrace.cache]
    filled = hr_runs[0].headrace.cache if hr_runs[0].headrace else None
    stored = (f", in which headrace also stored {filled.inserts} samples "
              f"({units.size(sum(filled.bytes_by_tier.values()))}) in its cache"
              if filled is not None and filled.inserts else " (nothing cached yet)")
    first = (f"epoch 1 took {hr_runs[0].wall_s:.2f} s vs {torch_runs[0].wall_s:.2f} s"
             f"{stored}")
    if len(hr_runs) < 2:
        return (f"Why: {first}; only one epoch ran, so headrace never read its cache back "
                "(with --epochs 2 or more, later epochs are served from it).")
    if caches and later_t:
        lookups = sum(c.lookups for c in caches)
        hits = sum(c.hits for c in caches)
        tiers: dict[str, int] = {}
        for c in caches:
            for k, v in c.hits_by_tier.items():
                tiers[k] = tiers.get(k, 0) + v
        top = max(tiers, key=lambda k: tiers[k]) if tiers else "no"
        rate = hits / lookups if lookups else 0.0
        later = "in epoch 2" if len(hr_runs) == 2 else f"in epochs 2-{len(hr_runs)}"
        took = ("epoch 2 took" if len(hr_runs) == 2 else "an epoch took")
        medians = "" if len(hr_runs) == 2 else " (medians)"
        return (f"Why: {first}; {later} headrace served {rate:.0%} of "
                f"samples from its sample cache (mostly the {top} form, so those steps did "
                f"not run again), and {took} {statistics.median(later_h):.2f} s vs "
                f"torch's {statistics.median(later_t):.2f} s{medians}.")
    return f"Why: {first}; headrace's cache was off or empty (Options(cache=None)?)."


def _plot(torch_runs: list[RunRecord], hr_runs: list[RunRecord], path: Path) -> Path:
    """Samples delivered over the whole job (epochs back to back) and wall time per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), width_ratios=(2, 1))
    width = 0.4
    for k, (label, runs) in enumerate((("torch DataLoader", torch_runs),
                                       ('headrace, num_workers="auto"', hr_runs))):
        t0, n0, ts, ns = 0.0, 0, [0.0], [0]
        for r in runs:
            for t, _w, n in r.batch_times:
                n0 += n
                ts.append(t0 + t)
                ns.append(n0)
            t0 += r.wall_s
        ax1.step(ts, ns, where="post", label=f"{label}: {t0:.1f} s")
        xs = [e + (k - 0.5) * width for e in range(1, len(runs) + 1)]
        ax2.bar(xs, [r.wall_s for r in runs], width, label=label)
    ax1.set_xlabel("training time (s), epochs back to back")
    ax1.set_ylabel("images trained on")
    ax1.legend()
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("epoch wall time (s)")
    ax2.set_xticks(range(1, len(torch_runs) + 1))
    fig.suptitle("headrace demo: the same training job with each loader")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_demo(cfg: DemoConfig, out: Callable[[str], None] = print) -> BenchResult:
    """Generate the data, train with each loader, print the comparison, write the plot."""
    n = cfg.steps * cfg.batch_size
    workers = cfg.workers if cfg.workers is not None else available_cpus()
    epochs = f"{cfg.epochs} epoch{'s' if cfg.epochs != 1 else ''}"
    out(f"headrace demo: {n} generated ImageNet-like JPEGs, {epochs} of {cfg.steps} "
        f"training steps of {cfg.batch_size}, model on {cfg.threads} CPU thread(s)")
    wl = imagenet_workload(n, cfg.seed, cfg.cache_dir, num_workers=workers)
    wl = dataclasses.replace(
        wl, batch_size=cfg.batch_size, accelerator_step_s=0.0,
        description=f"headrace demo: {n} generated ImageNet-like JPEGs (Decode, "
        f"RandomResizedCrop 224, Flip, ToTensor, Normalize), batch {cfg.batch_size}, "
        f"{cfg.epochs} epochs; the consumer trains TinyNet on {cfg.threads} CPU thread(s) "
        "(the yardsticks use its mean measured step as the consumer step).",
    )
    order = sampler_order(n, cfg.seed)
    specs = [
        LoaderSpec("torch DataLoader", "torch", workers, 2, in_order=True,
                   persistent_workers=True),
        LoaderSpec("headrace", "headrace", workers, 2, in_order=False, auto_workers=True),
    ]
    for s in specs:
        out(f"  {s.label}: {s.describe()}")
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        with blas_limited(1):
            trained = [_train(wl, s, order, cfg) for s in specs]
    finally:
        torch.set_num_threads(threads)
    rows = tuple(
        summarize(dataclasses.replace(s, label=f"{s.label}, epoch {e + 1}"), [r])
        for s, (runs, _) in zip(specs, trained, strict=True) for e, r in enumerate(runs)
    )
    result = BenchResult(
        config=BenchConfig(workloads=("imagenet",), scales={}, repeats=1, warmup=False,
                           sweep=False, out_dir=cfg.out_dir),
        machine=machine_info(),
        command="headrace demo",
        started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        workloads=(WorkloadResult(wl, n / 1920, rows, (), None),),
    )
    out("")
    out(f"{'loader':<18} {'epoch':>5} {'wall s':>7} {'stall':>6} {'samples/s':>10} "
        f"{'÷ ideal':>8} {'cache hits':>10} {'loss':>7}")
    for (runs, losses), spec in zip(trained, specs, strict=True):
        per = max(1, len(losses) // len(runs))
        for e, r in enumerate(runs):
            tail = losses[(e + 1) * per - min(5, per):(e + 1) * per]
            cache = r.headrace.cache if r.headrace else None
            hits = f"{cache.hit_rate:.0%}" if cache is not None else "-"
            out(f"{spec.label:<18} {e + 1:>5} {r.wall_s:7.2f} {r.stall_fraction:6.1%} "
                f"{r.samples_per_s:10.1f} {r.vs_ideal:8.3f} {hits:>10} "
                f"{sum(tail) / max(1, len(tail)):7.3f}")
    (t_runs, _), (h_runs, _) = trained
    t_total = sum(r.wall_s for r in t_runs)
    h_total = sum(r.wall_s for r in h_runs)
    verdict = "faster" if h_total < t_total else "slower"
    out(f"\nheadrace trained {epochs} in {h_total:.2f} s vs torch's "
        f"{t_total:.2f} s: {t_total / h_total:.2f}× ({verdict}).")
    out(_reason(t_runs, h_runs))
    paths = write_outputs(result, cfg.out_dir, plots=False)
    plot = _plot(t_runs, h_runs, Path(paths["dir"]) / "demo.png").resolve()
    out(f"Plot: {plot}  (tables: {paths['markdown'].resolve()})")
    return result
