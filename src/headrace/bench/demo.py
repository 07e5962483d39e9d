"""``headrace demo``: train a small model on the CPU with torch's DataLoader, then with headrace.

The dataset is a generated ImageNet-like JPEG set (``headrace.workloads``, class = image tint,
so the model visibly learns). Both loaders get the same sampler order, workers, prefetch and
model initialisation; the training step runs in the consumer loop of the benchmark harness, so
the comparison uses the same measurements as ``headrace bench`` (wall, stall, samples/s,
wall ÷ ideal with the mean measured training step as the consumer step) and the same plots.
headrace starts cold (no stored profile), as on a first run, so the demo is repeatable.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from headrace.bench import write_outputs
from headrace.bench.config import BenchConfig, LoaderSpec
from headrace.bench.measure import RunRecord, run_once
from headrace.bench.runner import BenchResult, WorkloadResult, machine_info, sampler_order
from headrace.bench.summary import summarize
from headrace.bench.threads import blas_limited
from headrace.runtime import Options
from headrace.workloads import Workload, imagenet_workload


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """Settings of ``headrace demo``.

    Attributes:
        out_dir: where plots, ``results.json`` and ``results.md`` go.
        steps: training steps (batches) per loader: one epoch of ``steps × batch_size`` images.
        batch_size: images per batch.
        workers: worker processes, the same for both loaders.
        threads: torch intra-op threads for the model in the training process.
        seed: dataset, sampler order and model initialisation seed.
        cache_dir: where the generated JPEGs live (``None``: the workloads' default).
        progress: show a tqdm progress bar per loader.
    """

    out_dir: str = "demo-out"
    steps: int = 30
    batch_size: int = 32
    workers: int = 2
    threads: int = 1
    seed: int = 0
    cache_dir: str | None = None
    progress: bool = True


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


def _train(wl: Workload, spec: LoaderSpec, order: list[int], cfg: DemoConfig) -> tuple[RunRecord, list[float]]:
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=wl.num_batches, desc=f"{spec.label:<18}", unit="batch", file=sys.stderr)
    step, losses = _trainer(cfg.seed, bar)
    try:
        # cold start, as on a first run: no stored profile from earlier demos
        record = run_once(wl, spec, order, consume=step, options=Options(profile_store=False))
    finally:
        if bar is not None:
            bar.close()
    return record, losses


def run_demo(cfg: DemoConfig, out: Callable[[str], None] = print) -> BenchResult:
    """Generate the data, train with each loader, print the comparison, write the plots."""
    n = cfg.steps * cfg.batch_size
    out(f"headrace demo: {n} generated ImageNet-like JPEGs, {cfg.steps} training steps of "
        f"{cfg.batch_size}, {cfg.workers} workers per loader, model on {cfg.threads} CPU thread(s)")
    wl = imagenet_workload(n, cfg.seed, cfg.cache_dir, num_workers=cfg.workers)
    wl = dataclasses.replace(
        wl, batch_size=cfg.batch_size, accelerator_step_s=0.0,
        description=f"headrace demo: {n} generated ImageNet-like JPEGs (Decode, "
        f"RandomResizedCrop 224, Flip, ToTensor, Normalize), batch {cfg.batch_size}, "
        f"{cfg.workers} workers; the consumer trains TinyNet on {cfg.threads} CPU thread(s) "
        "(the yardsticks use its mean measured step as the consumer step).",
    )
    order = sampler_order(n, cfg.seed)
    specs = [
        LoaderSpec("torch DataLoader", "torch", cfg.workers, 2, in_order=True),
        LoaderSpec("headrace", "headrace", cfg.workers, 2, in_order=False),
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        with blas_limited(1):
            trained = [_train(wl, s, order, cfg) for s in specs]
    finally:
        torch.set_num_threads(threads)
    rows = tuple(summarize(s, [r]) for s, (r, _) in zip(specs, trained, strict=True))
    result = BenchResult(
        config=BenchConfig(workloads=("imagenet",), scales={}, repeats=1, warmup=False,
                           sweep=False, out_dir=cfg.out_dir),
        machine=machine_info(),
        command="headrace demo",
        started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        workloads=(WorkloadResult(wl, n / 1920, rows, (), None),),
    )
    out("")
    out(f"{'loader':<18} {'wall s':>7} {'stall':>6} {'samples/s':>10} {'÷ ideal':>8} "
        f"{'step ms':>8} {'final loss':>10}")
    for (r, losses), spec in zip(trained, specs, strict=True):
        tail = losses[-5:]
        out(f"{spec.label:<18} {r.wall_s:7.2f} {r.stall_fraction:6.1%} {r.samples_per_s:10.1f} "
            f"{r.vs_ideal:8.3f} {1000 * r.consumer_step_s:8.1f} {sum(tail) / len(tail):10.3f}")
    (t, _), (h, _) = trained
    verdict = "faster" if h.wall_s < t.wall_s else "slower"
    out(f"\nheadrace took {h.wall_s:.2f} s vs {t.wall_s:.2f} s: {t.wall_s / h.wall_s:.2f}× "
        f"({verdict}); ideal = a zero-overhead sample-level loader on the same order and "
        "measured costs.")
    paths = write_outputs(result, cfg.out_dir)
    out(f"Plots and tables written to {Path(paths['dir']).resolve()}/ "
        f"({', '.join(sorted(p.name for p in Path(paths['dir']).glob('*.png')))}, "
        f"{paths['markdown'].name}, {paths['json'].name}).")
    return result
