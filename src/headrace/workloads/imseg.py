"""The 3D image segmentation workload (KiTS19 / 3D-UNet, MinatoLoader Table 1).

Steps follow MLPerf's 3D-UNet training transforms, in the paper's order: RandomCrop (balanced:
with probability 0.4 the patch is placed on a foreground object found by connected-component
labelling over the whole volume, else anywhere), RandomFlip (each axis with probability 1/3),
RandomBrightness (×[0.7, 1.3] with probability 0.1), GaussianNoise (σ up to 0.1 with probability
0.1; float64 as in the reference) and Cast (image float32, label uint8). The crop dominates and
its foreground branch scales with the volume, so per-sample cost is heavy-tailed like the sizes.

Final sample: ``{"image": float32 (1, 40, 40, 40), "label": uint8 (1, 40, 40, 40), "index": int}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import ndimage

from headrace.pipeline import Pipeline, step
from headrace.workloads.volumes import VolumeSource
from headrace.workloads.workload import Workload, cpu_bound_workers

Sample = dict[str, Any]

BASE_SAMPLES = 1200
"""Volumes at ``scale=1.0``: 400 batches of 3 (about 3 s of work on 2 cores)."""

PATCH = (40, 40, 40)
"""Crop size (D, H, W) in voxels: KiTS19's 128³ patch scaled like the volumes."""

ACCELERATOR_STEP_S = 0.008
"""Simulated 3D-UNet step per batch of 3, in seconds: about 0.8 × the time 2 cores need to
prepare a batch (3 × ~6 ms / 2), so the input pipeline is the bottleneck."""


@dataclass(frozen=True)
class RandomCrop:
    """Crop ``patch`` voxels; with probability ``oversampling`` around a foreground object.

    The foreground branch (MLPerf ``RandBalancedCrop``) picks a class present in the label,
    labels its connected components (O(volume)), takes one of the two largest and places the
    patch so that it covers as much of the object as fits.
    """

    patch: tuple[int, int, int] = PATCH
    oversampling: float = 0.4

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        label = s["label"][0]
        if any(d < p for d, p in zip(label.shape, self.patch, strict=True)):
            raise ValueError(f"volume {label.shape} is smaller than the crop {self.patch}")
        low = None
        if rng.random() < self.oversampling:
            low = self._foreground_corner(label, rng)
        if low is None:
            low = [
                int(rng.integers(0, d - p + 1))
                for d, p in zip(label.shape, self.patch, strict=True)
            ]
        box = (slice(None), *(slice(a, a + p) for a, p in zip(low, self.patch, strict=True)))
        return {
            "image": np.ascontiguousarray(s["image"][box]),
            "label": np.ascontiguousarray(s["label"][box]),
            "index": s["index"],
        }

    def _foreground_corner(self, label: np.ndarray, rng: np.random.Generator) -> list[int] | None:
        classes = np.unique(label[label > 0])
        if classes.size == 0:
            return None
        cls = rng.choice(classes)
        components, _ = ndimage.label(label == cls)
        objects = [o for o in ndimage.find_objects(components) if o is not None]
        if not objects:
            return None
        sizes = [np.prod([sl.stop - sl.start for sl in o]) for o in objects]
        largest = [objects[i] for i in np.argsort(sizes)[-2:]]
        obj = largest[int(rng.integers(0, len(largest)))]
        low = []
        for sl, dim, p in zip(obj, label.shape, self.patch, strict=True):
            if sl.stop - sl.start <= p:  # the object fits: any placement that contains it
                a, b = max(0, sl.stop - p), min(sl.start, dim - p)
            else:  # larger than the patch: a window inside the object
                a, b = sl.start, sl.stop - p
            low.append(int(rng.integers(a, max(a, b) + 1)))
        return low


@dataclass(frozen=True)
class RandomFlip:
    """Flip image and label along each spatial axis independently with probability ``p``."""

    p: float = 1 / 3

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        axes = tuple(ax for ax in (1, 2, 3) if rng.random() < self.p)
        if not axes:
            return s
        return {
            **s,
            "image": np.flip(s["image"], axes).copy(),
            "label": np.flip(s["label"], axes).copy(),
        }


@dataclass(frozen=True)
class RandomBrightness:
    """With probability ``p``, scale intensities by a factor in ``[1 - factor, 1 + factor]``."""

    factor: float = 0.3
    p: float = 0.1

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        if rng.random() >= self.p:
            return s
        scale = rng.uniform(1.0 - self.factor, 1.0 + self.factor)
        return {**s, "image": s["image"] * np.float32(scale)}


@dataclass(frozen=True)
class GaussianNoise:
    """With probability ``p``, add N(0, σ²) noise with σ uniform in [0, ``std``] (float64 result)."""

    std: float = 0.1
    p: float = 0.1

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        if rng.random() >= self.p:
            return s
        sigma = rng.uniform(0.0, self.std)
        return {**s, "image": s["image"] + rng.normal(0.0, sigma, s["image"].shape)}


def cast(s: Sample) -> Sample:
    """Image to float32, label to uint8 (no copy when already so)."""
    return {
        **s,
        "image": s["image"].astype(np.float32, copy=False),
        "label": s["label"].astype(np.uint8, copy=False),
    }


def imseg_workload(
    num_samples: int = BASE_SAMPLES,
    seed: int = 0,
    num_workers: int | None = None,
    accelerator_step_s: float = ACCELERATOR_STEP_S,
    patch: tuple[int, int, int] = PATCH,
    size_scale: float = 1.0,
) -> Workload:
    """KiTS19-like 3D segmentation: heavy-tailed volumes (0.5-8 MB), MLPerf's transforms, batch 3.

    Args:
        num_samples: volumes per epoch.
        seed: dataset seed (sizes and content).
        num_workers: worker budget (default: :func:`cpu_bound_workers`, the usable cores, at
            most 4).
        accelerator_step_s: simulated step per batch in seconds. Every step here is real
            work, so ``time_scale`` does not apply.
        patch: crop size (D, H, W) in voxels; volumes are at least this large on every axis.
        size_scale: factor on volume sizes (default 0.5-8 MB, median 2 MB); per-sample cost
            grows about in proportion.
    """
    num_workers = cpu_bound_workers() if num_workers is None else num_workers
    if size_scale <= 0:
        raise ValueError(f"size_scale must be > 0, got {size_scale}")
    source = VolumeSource(
        num_samples,
        seed,
        median_mb=2.0 * size_scale,
        min_mb=0.5 * size_scale,
        max_mb=8.0 * size_scale,
        min_side=max(patch),
    )
    steps = [
        step(RandomCrop(patch), name="RandomCrop", random=True, kind="augment"),
        step(RandomFlip(), name="RandomFlip", random=True, kind="augment"),
        step(RandomBrightness(), name="RandomBrightness", random=True, kind="augment"),
        step(GaussianNoise(), name="GaussianNoise", random=True, kind="augment"),
        step(cast, name="Cast"),
    ]
    return Workload(
        name="imseg",
        pipeline=Pipeline(source, steps),
        batch_size=3,
        num_workers=num_workers,
        accelerator_step_s=accelerator_step_s,
        description=(
            f"KiTS19-like 3D segmentation: {num_samples} synthetic CT volumes, lognormal sizes "
            f"{0.5 * size_scale:g}-{8 * size_scale:g} MB (median {2 * size_scale:g} MB; the "
            f"paper's 30-375 MB scaled by ~{size_scale / 45:.2g}); RandomCrop to "
            f"{patch} (foreground-balanced, O(volume)), RandomFlip, RandomBrightness, "
            f"GaussianNoise, Cast; batch 3, {num_workers} workers, accelerator step "
            f"{accelerator_step_s * 1e3:g} ms per batch."
        ),
    )
