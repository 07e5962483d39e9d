"""``headrace train``: a real training run, torch's DataLoader vs headrace, with GPU utilization.

The simulated accelerator of ``headrace bench`` sleeps a fixed time per batch; here a model
trains: a ResNet on the imagenet workload, a 3D U-Net on imseg, an LSTM encoder on speech
(``bench/models.py``; speech's target is the utterance's duration class, see
:func:`speech_label`). For each workload and loader, the same model initialisation, the same
sampler order (hence the same samples each epoch), the same worker budget; per epoch it records
the wall time (until the device finished the last step), the time ``next()`` blocked, the loss
of every step and, on a CUDA device with ``nvidia-ml-py``, the GPU utilization over time
(``bench/gpu_util.py``). Before the loaders run, it times the model's training step on a batch
already on the device (:func:`measure_model_step`): the accelerator's own time per batch,
and its utilization with no loader in the way, the ceiling a loader can reach.

Both loaders use the last mile as a user would: torch's with ``pin_memory=True`` and
``batch.to(device, non_blocking=True)``; headrace with ``pin_memory=True`` and
``Options(device=...)`` (batches assembled in pinned memory, copied ahead on a side stream).
The fixed order is passed as a list sampler (so both see the same samples); headrace gets
``in_order=False``, what it chooses by itself for ``shuffle=True`` (it keeps a custom
sampler's order unless told otherwise).
On the CPU (no CUDA) it runs the same code with tiny models and no utilization: the CI smoke
test. Losses stay on the device until an epoch ends, so logging never synchronizes a step.
Timings are only meaningful on a quiet machine; tests never assert them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.utils.data as tud
from torch import nn
from torch.nn import functional as F

from headrace.bench.gpu_util import UtilizationSampler, mean_between, nvml_available
from headrace.bench.models import ResNet, SpeechLSTM, UNet3D
from headrace.bench.runner import machine_info, sampler_order
from headrace.bench.train_report import markdown, plot
from headrace.runtime.native_threads import blas_limited
from headrace.workloads import Workload, get_workload
from headrace.workloads.speech import SAMPLE_RATE

TRAIN_WORKLOADS = ("imagenet", "imseg", "speech-3s", "speech-10s")
"""Workloads with a model here: imagenet (ResNet, 10 classes), imseg (3D U-Net, 3 classes),
speech (LSTM encoder, :data:`SPEECH_CLASSES` duration classes)."""

SPEECH_CLASSES = 4
"""Duration classes of the speech target: quarters of the utterances' 1-3 s range."""

LOADERS = ("torch", "headrace", "headrace-host")
"""torch's DataLoader; headrace with ``Options(device=)`` (device prefetch); headrace without it
(pinned host batches the loop copies itself, as with torch): the last mile's own share."""

DEFAULT_LOADERS = ("torch", "headrace")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Settings of ``headrace train``.

    Attributes:
        workloads: among :data:`TRAIN_WORKLOADS`.
        scale: factor on each workload's preset samples per epoch.
        samples: exact samples per epoch (overrides ``scale``).
        epochs: epochs per loader (the first includes worker start-up and warm-up).
        workers: worker budget for both loaders (``None``: the workload's).
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"`` (``None``: CUDA when present).
        width: model width (``None``: GPU-sized when training on CUDA, tiny on the CPU).
        depth: speech's LSTM layers (``None``: RNN-T's 5 on CUDA, 1 on the CPU); a deeper
            stack makes a longer step (the layers run one after the other).
        blas_threads: OpenBLAS threads in the training process while each run goes on,
            inherited by torch's forked workers, as ``headrace bench`` does (headrace's workers
            set one themselves, ``Options.worker_blas_threads``); 0 leaves the count alone,
            one pool per core in every torch worker, which is what torch users get by default.
        amp: bfloat16 autocast on CUDA.
        model_warmup: untimed training steps of the model alone before :func:`measure_model_step`
            times it (cuDNN autotuning, allocator).
        model_steps: timed steps of the model alone (their median is ``ModelStep.step_s``).
        seed: dataset, sampler order and model initialisation seed.
        interval_s: GPU utilization sampling period, seconds.
        loaders: which loaders to run, among :data:`LOADERS`.
        out_dir: where ``train.json``, ``train.md`` and ``train.png`` go.
        cache_dir: where generated JPEG sets are kept (``None``: the workloads' default).
    """

    workloads: tuple[str, ...] = TRAIN_WORKLOADS
    scale: float = 1.0
    samples: int | None = None
    epochs: int = 2
    workers: int | None = None
    device: str | None = None
    width: int | None = None
    depth: int | None = None
    amp: bool = True
    model_warmup: int = 3
    model_steps: int = 10
    seed: int = 0
    interval_s: float = 0.1
    blas_threads: int = 1
    loaders: tuple[str, ...] = DEFAULT_LOADERS
    out_dir: str = "train-out"
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        bad = [w for w in self.workloads if w not in TRAIN_WORKLOADS]
        if bad:
            raise ValueError(f"no model for workload(s) {bad}; choose from {TRAIN_WORKLOADS}")
        bad = [x for x in self.loaders if x not in LOADERS]
        if bad:
            raise ValueError(f"unknown loader(s) {bad}; choose from {LOADERS}")
        if self.epochs < 1:
            raise ValueError("epochs must be >= 1")
        if self.model_warmup < 0 or self.model_steps < 1:
            raise ValueError("model_warmup must be >= 0 and model_steps >= 1")

    def resolved_device(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """One loader training one model on one workload.

    Attributes:
        epoch_s: wall time of each epoch, seconds (``iter()`` until the device finished).
        stall_s: per epoch, seconds the training loop waited in ``next()``.
        losses: per epoch, the loss of every step, in order.
        samples: per epoch, samples trained on.
        utilization: ``(seconds since the run started, GPU utilization %)``; empty without NVML.
        epoch_bounds: per epoch, ``(start, end)`` in the same seconds as ``utilization``.
        mean_utilization: per epoch, mean GPU utilization (%), ``None`` without NVML.
        loop_cpu_s: per epoch, CPU seconds of the training loop's thread (``next()``
            included): against ``epoch_s``, how much the loop computed and how much it waited
            (for a batch, for the GIL, or for the device at the end).
        process_cpu_s: per epoch, CPU seconds of the whole training process, all its threads
            (the loader's own threads in it: torch's pin-memory thread, headrace's scheduler),
            not its worker processes.
        model: the model alone on this workload (:func:`measure_model_step`; the same for both
            loaders): its step time and the utilization ceiling.
    """

    workload: str
    loader: str
    epoch_s: list[float]
    stall_s: list[float]
    losses: list[list[float]]
    samples: list[int]
    utilization: list[tuple[float, int]]
    epoch_bounds: list[tuple[float, float]]
    mean_utilization: list[float | None]
    model: ModelStep
    loop_cpu_s: list[float]
    process_cpu_s: list[float]


def make_model(workload: str, width: int | None, on_gpu: bool,
               depth: int | None = None) -> nn.Module:
    """The model for ``workload``; ``width`` (and speech's ``depth``) ``None``: GPU-sized on a
    GPU, tiny on the CPU."""
    if workload == "imagenet":
        return ResNet(10, width or (32 if on_gpu else 4), blocks=2 if on_gpu else 1)
    if workload == "imseg":
        return UNet3D(3, width or (16 if on_gpu else 4), depth=3 if on_gpu else 2)
    return SpeechLSTM(SPEECH_CLASSES, width or (1024 if on_gpu else 8),
                      layers=depth or (5 if on_gpu else 1))


def speech_label(length: torch.Tensor) -> torch.Tensor:
    """An utterance's duration class from its unpadded length in audio samples: which quarter
    of the workload's 1-3 s range it falls in (0-3). The features show it (the padding is
    silent), so the loss falls as the model learns; the dataset itself carries no label."""
    quarter = (length.float() / SAMPLE_RATE - 1.0) * (SPEECH_CLASSES / 2.0)
    return quarter.long().clamp(0, SPEECH_CLASSES - 1)


def _inputs(workload: str, batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input, target)`` on ``device``; ``.to`` is a no-op for headrace's device batches."""
    if workload.startswith("speech"):
        x = torch.as_tensor(batch["features"]).to(device, non_blocking=True)
        return x, speech_label(torch.as_tensor(batch["length"]).to(device, non_blocking=True))
    x = torch.as_tensor(batch["image"]).to(device, non_blocking=True)
    y = torch.as_tensor(batch["label"]).to(device, non_blocking=True).long()
    return x, (y if workload == "imagenet" else y.squeeze(1))


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                amp: bool) -> torch.Tensor:
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach().float()


@dataclasses.dataclass(frozen=True)
class ModelStep:
    """The model alone, on a batch already on the device (no loader in the way).

    Attributes:
        step_s: median seconds of one training step (each timed step ends when the device
            finished it): a loader that delivers a batch every ``step_s`` keeps up.
        utilization: mean GPU utilization (%) while steps ran back to back: the most any
            loader can reach with this model (kernel launches and the optimizer's small
            kernels leave gaps); ``None`` without NVML.
    """

    step_s: float
    utilization: float | None


def measure_model_step(wl: Workload, cfg: TrainConfig, order: list[int],
                       ceiling_s: float = 3.0) -> ModelStep:
    """Time a fresh model's training step on the epoch's first batch (``order[:batch_size]``,
    collated as torch does) and, with NVML, its utilization over ``ceiling_s`` seconds of
    steps back to back (leaving out the first 0.5 s, which NVML's sample period, up to 1 s,
    may mix with the idle time before). ``cfg.model_warmup`` warm-up steps (cuDNN autotuning,
    allocator) are not measured; ``cfg.model_steps`` are."""
    device = cfg.resolved_device()
    on_gpu = device.type == "cuda"
    amp = on_gpu and cfg.amp
    torch.manual_seed(cfg.seed)
    model = make_model(wl.name, cfg.width, on_gpu, cfg.depth).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    batch = tud.default_collate([wl.pipeline[i] for i in order[: wl.batch_size]])
    x, y = _inputs(wl.name, batch, device)
    times = []
    for k in range(cfg.model_warmup + cfg.model_steps):
        t0 = time.perf_counter()
        _train_step(model, opt, x, y, amp)
        if on_gpu:
            torch.cuda.synchronize(device)
        if k >= cfg.model_warmup:
            times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    if not (on_gpu and nvml_available()):
        return ModelStep(step_s, None)
    with UtilizationSampler(device, cfg.interval_s) as sampler:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < ceiling_s:
            for _ in range(max(1, int(0.1 / step_s))):  # queue ~0.1 s of steps, as training does
                _train_step(model, opt, x, y, amp)
            torch.cuda.synchronize(device)
    return ModelStep(step_s, mean_between(sampler.samples, 0.5, float("inf")))


def _make_loader(kind: str, wl: Workload, order: list[int], workers: int, device: torch.device,
                 seed: int) -> Any:
    common: dict[str, Any] = {
        "batch_size": wl.batch_size, "sampler": order, "num_workers": workers,
        "pin_memory": device.type == "cuda", "persistent_workers": workers > 0,
    }
    if kind == "torch":
        return tud.DataLoader(wl.pipeline, **common)  # type: ignore[arg-type]  # map-style
    from headrace.runtime import DataLoader, Options

    opts = Options(seed=seed, profile_store=False,
                   device=device if device.type == "cuda" and kind == "headrace" else None)
    return DataLoader(wl.pipeline, options=opts, in_order=False, **common)


def train_one(wl: Workload, kind: str, cfg: TrainConfig, order: list[int], alone: ModelStep,
              log: Callable[[str], None] = lambda _m: None) -> TrainRun:
    """Train a fresh model on ``wl`` for ``cfg.epochs`` epochs with loader ``kind``
    (``alone``: :func:`measure_model_step` of this workload, recorded with the run)."""
    device = cfg.resolved_device()
    on_gpu = device.type == "cuda"
    torch.manual_seed(cfg.seed)
    model = make_model(wl.name, cfg.width, on_gpu, cfg.depth).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    workers = cfg.workers if cfg.workers is not None else wl.num_workers
    loader = _make_loader(kind, wl, order, workers, device, cfg.seed)
    sampler = UtilizationSampler(device, cfg.interval_s) if on_gpu and nvml_available() else None
    runs: dict[str, list[Any]] = {"epoch_s": [], "stall_s": [], "losses": [], "samples": [],
                                  "bounds": [], "loop_cpu": [], "process_cpu": []}
    if sampler is not None:
        sampler.start()
    t_run = time.perf_counter()
    try:
        for epoch in range(cfg.epochs):
            t0, stall, n = time.perf_counter(), 0.0, 0
            c0, p0 = time.thread_time(), time.process_time()
            losses: list[torch.Tensor] = []
            it = iter(loader)
            while True:
                a = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                stall += time.perf_counter() - a
                x, y = _inputs(wl.name, batch, device)
                losses.append(_train_step(model, opt, x, y, on_gpu and cfg.amp))
                n += len(y)
            if on_gpu:
                torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            runs["loop_cpu"].append(time.thread_time() - c0)
            runs["process_cpu"].append(time.process_time() - p0)
            runs["epoch_s"].append(t1 - t0)
            runs["stall_s"].append(stall)
            runs["losses"].append(torch.stack(losses).cpu().tolist() if losses else [])
            runs["samples"].append(n)
            runs["bounds"].append((t0 - t_run, t1 - t_run))
            log(f"  {wl.name:<9} {kind:<9} epoch {epoch}: {t1 - t0:7.2f} s, stall {stall:6.2f} s, "
                f"last loss {runs['losses'][-1][-1] if losses else float('nan'):.3f}")
    finally:
        util = sampler.stop() if sampler is not None else []
        if hasattr(loader, "close"):
            loader.close()
        del loader
    # the sampler's clock starts a little before t_run: align on t_run
    shift = (sampler._t0 - t_run) if sampler is not None else 0.0
    util = [(t + shift, u) for t, u in util]
    means: list[float | None] = [mean_between(util, a, b) for a, b in runs["bounds"]]
    return TrainRun(wl.name, kind, runs["epoch_s"], runs["stall_s"], runs["losses"],
                    runs["samples"], util, runs["bounds"], means, alone, runs["loop_cpu"],
                    runs["process_cpu"])


def run_train(cfg: TrainConfig, log: Callable[[str], None] = print) -> list[TrainRun]:
    """Every workload × loader of ``cfg``; writes ``train.json`` and ``train.md`` (and
    ``train.png`` when matplotlib is installed) into ``cfg.out_dir``."""
    device = cfg.resolved_device()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    sampled = "sampled" if device.type == "cuda" and nvml_available() else "not sampled"
    log(f"headrace train on {device} ({gpu}), GPU utilization {sampled}")
    runs = []
    for name in cfg.workloads:
        wl = get_workload(name, scale=cfg.scale, seed=cfg.seed, cache_dir=cfg.cache_dir,
                          num_samples=cfg.samples)
        order = sampler_order(len(wl), cfg.seed)
        alone = measure_model_step(wl, cfg, order)
        ceiling = "" if alone.utilization is None else f", GPU util {alone.utilization:.0f}%"
        log(f"  {name}: model alone {alone.step_s * 1e3:.1f} ms per batch of {wl.batch_size}"
            f"{ceiling} (a batch already on {device})")
        for kind in cfg.loaders:
            with blas_limited(cfg.blas_threads):
                runs.append(train_one(wl, kind, cfg, order, alone, log))
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": dataclasses.asdict(cfg),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "machine": machine_info(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "runs": [dataclasses.asdict(r) for r in runs],
    }
    (out / "train.json").write_text(json.dumps(doc, indent=1))
    (out / "train.md").write_text(markdown(runs, doc))
    plot(runs, out / "train.png")
    return runs
