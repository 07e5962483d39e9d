"""Image workloads on generated JPEGs: ``objdet`` (OpenImages/COCO-like) and ``imagenet``.

Their raw sizes follow SOPHON §2: after Decode and the crop to 224 × 224 × 3 uint8
(150,528 bytes), about 3 in 4 OpenImages samples are smaller than their JPEG, while about 3 in 4
ImageNet samples are larger (small JPEGs that grow when decoded). ``objdet`` draws large images
(longer side median 960 px) and runs MinatoLoader's object-detection steps (Decode, Resize,
Flip, ToTensor, Normalize); ``imagenet`` draws small ones (median 520 px) and runs the PyTorch
ImageNet example's (Decode, RandomResizedCrop, Flip, ToTensor, Normalize).

Final sample: ``{"image": float32 (3, 224, 224), "label": int, "index": int}``.
"""

from __future__ import annotations

import os

from headrace.pipeline import Pipeline, step
from headrace.workloads.jpegs import JpegSource, JpegSpec, ensure_jpegs
from headrace.workloads.vision import Flip, Normalize, RandomResizedCrop, Resize, decode, to_tensor
from headrace.workloads.workload import Workload, cpu_bound_workers

OBJDET_BASE_SAMPLES = 960
"""Images at ``scale=1.0`` for ``objdet``: 20 batches of 48."""

IMAGENET_BASE_SAMPLES = 1920
"""Images at ``scale=1.0`` for ``imagenet``: 30 batches of 64."""

OBJDET_ACCELERATOR_STEP_S = 0.22
"""Simulated step per batch of 48, in seconds: about 0.8 × the time 2 cores need to prepare a
batch (48 × ~12 ms / 2), so the input pipeline is the bottleneck."""

IMAGENET_ACCELERATOR_STEP_S = 0.15
"""Simulated step per batch of 64, in seconds: about 0.8 × the time 2 cores need to prepare a
batch (64 × ~6 ms / 2)."""


def openimages_spec(num_samples: int, seed: int = 0) -> JpegSpec:
    """Large photographs: longer side lognormal, median 960 px, 320-1600 px (mean JPEG ~320 KB)."""
    return JpegSpec("openimages", num_samples, seed, 960.0, 0.35, 320, 1600)


def imagenet_spec(num_samples: int, seed: int = 0) -> JpegSpec:
    """ImageNet-sized photographs: longer side lognormal, median 520 px, 120-1200 px (mean JPEG ~110 KB)."""
    return JpegSpec("imagenet", num_samples, seed, 520.0, 0.4, 120, 1200)


def objdet_workload(
    num_samples: int = OBJDET_BASE_SAMPLES,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    num_workers: int | None = None,
    accelerator_step_s: float = OBJDET_ACCELERATOR_STEP_S,
) -> Workload:
    """Object detection (MinatoLoader Table 1) on large, OpenImages-like JPEGs; batch 48.

    Args:
        num_samples: images per epoch (generated once into ``cache_dir``).
        seed: generation seed.
        cache_dir: where generated sets live; default ``$TMPDIR/headrace-workloads``.
        num_workers: worker budget (default: :func:`cpu_bound_workers`, the usable cores, at
            most 4).
        accelerator_step_s: simulated step per batch, in seconds (all steps are real work,
            so ``time_scale`` does not apply).
    """
    num_workers = cpu_bound_workers() if num_workers is None else num_workers
    root = ensure_jpegs(openimages_spec(num_samples, seed), cache_dir)
    steps = [
        step(decode, name="Decode", kind="decode"),
        step(Resize(256, 224), name="Resize"),
        step(Flip(), name="Flip", random=True, kind="augment"),
        step(to_tensor, name="ToTensor"),
        step(Normalize(), name="Normalize", keep_position=True),
    ]
    return Workload(
        name="objdet",
        pipeline=Pipeline(JpegSource.open(root), steps),
        batch_size=48,
        num_workers=num_workers,
        accelerator_step_s=accelerator_step_s,
        description=(
            f"Object detection: {num_samples} generated OpenImages-like JPEGs (longer side "
            f"median 960 px; most shrink after decode + crop, SOPHON §2); Decode, Resize "
            f"(shorter side 256, center 224), Flip, ToTensor, Normalize; batch 48, "
            f"{num_workers} workers, accelerator step {accelerator_step_s * 1e3:g} ms per batch."
        ),
    )


def imagenet_workload(
    num_samples: int = IMAGENET_BASE_SAMPLES,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    num_workers: int | None = None,
    accelerator_step_s: float = IMAGENET_ACCELERATOR_STEP_S,
) -> Workload:
    """Image classification on small, ImageNet-like JPEGs; batch 64.

    Arguments as for :func:`objdet_workload`.
    """
    num_workers = cpu_bound_workers() if num_workers is None else num_workers
    root = ensure_jpegs(imagenet_spec(num_samples, seed), cache_dir)
    steps = [
        step(decode, name="Decode", kind="decode"),
        step(RandomResizedCrop(224), name="RandomResizedCrop", random=True, kind="augment"),
        step(Flip(), name="Flip", random=True, kind="augment"),
        step(to_tensor, name="ToTensor"),
        step(Normalize(), name="Normalize", keep_position=True),
    ]
    return Workload(
        name="imagenet",
        pipeline=Pipeline(JpegSource.open(root), steps),
        batch_size=64,
        num_workers=num_workers,
        accelerator_step_s=accelerator_step_s,
        description=(
            f"ImageNet-like classification: {num_samples} generated JPEGs (longer side median "
            f"520 px; most grow after decode + crop, SOPHON §2); Decode, RandomResizedCrop 224, "
            f"Flip, ToTensor, Normalize; batch 64, {num_workers} workers, accelerator step "
            f"{accelerator_step_s * 1e3:g} ms per batch."
        ),
    )
