"""Synthetic KiTS19-like CT volumes: heavy-tailed sizes, two kidneys and a tumor.

KiTS19 cases span 30-375 MB (mean 136 MB, MinatoLoader §2.2). These volumes keep that shape of
distribution at about 1/45 the size: image bytes are lognormal, truncated to
``[min_mb, max_mb]`` (0.5-8 MB by default). Content is a pure function of ``(seed, index)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

Sample = dict[str, Any]

KIDNEY = 1
TUMOR = 2


@dataclass(frozen=True)
class VolumeSource:
    """``load(i) -> {"image": float32 (1, D, H, W), "label": uint8 (1, D, H, W), "index": i}``.

    Attributes:
        num_samples: volumes per epoch.
        seed: dataset seed.
        median_mb: median image size in MB (10**6 bytes, float32 voxels).
        sigma: lognormal shape of the size distribution (log-space standard deviation).
        min_mb, max_mb: truncation of the size distribution, in MB.
        min_side: smallest extent of any axis, in voxels (at least the crop size).
    """

    num_samples: int
    seed: int = 0
    median_mb: float = 2.0
    sigma: float = 0.6
    min_mb: float = 0.5
    max_mb: float = 8.0
    min_side: int = 40

    def __len__(self) -> int:
        return self.num_samples

    def shape(self, index: int) -> tuple[int, int, int]:
        """The (D, H, W) shape of volume ``index``, without building it."""
        return _draw_shape(self._rng(index), self)

    def load(self, index: int) -> Sample:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} volumes")
        rng = self._rng(index)
        shape = _draw_shape(rng, self)
        image, label = _draw_volume(rng, shape)
        return {"image": image[None], "label": label[None], "index": index}

    def fingerprint(self) -> str:
        return (
            f"volumes:{self.num_samples}:{self.seed}:{self.median_mb}:{self.sigma}:"
            f"{self.min_mb}:{self.max_mb}:{self.min_side}"
        )

    def _rng(self, index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, index])


def _draw_shape(rng: np.random.Generator, src: VolumeSource) -> tuple[int, int, int]:
    """Size from a truncated lognormal, then (D, H, W) with H == W and D/H in [0.6, 1.6]."""
    while True:  # rejection keeps the truncated distribution's shape (no mass piled on the bounds)
        mb = src.median_mb * float(np.exp(rng.normal(0.0, src.sigma)))
        if src.min_mb <= mb <= src.max_mb:
            break
    voxels = mb * 1e6 / 4
    ratio = rng.uniform(0.6, 1.6)
    side = (voxels / ratio) ** (1 / 3)
    d = max(src.min_side, round(side * ratio))
    hw = max(src.min_side, round(side))
    return d, hw, hw


def _ellipsoid(
    image: np.ndarray,
    label: np.ndarray,
    center: np.ndarray,
    radii: np.ndarray,
    value: int,
    intensity: float,
) -> None:
    """Paint an axis-aligned ellipsoid into ``label`` (class ``value``) and ``image``, in place."""
    lo = np.maximum(0, np.floor(center - radii)).astype(int)
    hi = np.minimum(label.shape, np.ceil(center + radii) + 1).astype(int)
    if np.any(hi <= lo):
        return
    grids = np.ogrid[lo[0] : hi[0], lo[1] : hi[1], lo[2] : hi[2]]
    dist = sum(((g - c) / r) ** 2 for g, c, r in zip(grids, center, radii, strict=True))
    inside = dist <= 1.0
    box = tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
    label[box][inside] = value
    image[box][inside] += intensity


_POOL_VOXELS = 2_500_000
"""Size of the shared noise pool, in voxels: more than the largest volume (8 MB / 4 bytes)."""


@functools.lru_cache(maxsize=1)
def _noise_pool() -> np.ndarray:
    """Standard normal float32 noise, drawn once per process from a fixed seed (about 10 ms).

    Volumes take a window of it at a per-sample offset: as random-looking as fresh noise for a
    loader benchmark, at the cost of a copy instead of a draw, so that loading stays cheaper
    than the crop, as reading a ``.npy`` file is in the real pipeline.
    """
    pool = np.random.default_rng(0x4B695453).standard_normal(_POOL_VOXELS, dtype=np.float32)
    pool.setflags(write=False)
    return pool


def _draw_volume(
    rng: np.random.Generator, shape: tuple[int, int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Image (float32, normalized intensities) and label (uint8: 0 background, 1 kidney, 2 tumor)."""
    d, h, w = shape
    voxels = d * h * w
    noise = _noise_pool()
    if voxels <= noise.size:
        start = int(rng.integers(0, noise.size - voxels + 1))
        image = noise[start : start + voxels].reshape(shape) * np.float32(0.3)
    else:  # larger than the pool (a custom max_mb): draw fresh noise
        image = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.3)
    yy, xx = np.ogrid[:h, :w]
    body = ((yy - h / 2) / (0.45 * h)) ** 2 + ((xx - w / 2) / (0.45 * w)) ** 2 <= 1.0
    image += np.where(body, np.float32(0.0), np.float32(-1.0))[None]
    label = np.zeros(shape, dtype=np.uint8)
    dims = np.array(shape, dtype=float)
    kidneys = []
    for side in (0.3, 0.7):
        center = dims * np.array([rng.uniform(0.35, 0.65), rng.uniform(0.4, 0.6), side])
        radii = dims * np.array([0.2, 0.1, 0.07]) * rng.uniform(0.8, 1.2, 3)
        _ellipsoid(image, label, center, radii, KIDNEY, 0.8)
        kidneys.append((center, radii))
    center, radii = kidneys[int(rng.integers(0, 2))]
    t_radii = radii * rng.uniform(0.2, 0.6)
    t_center = center + (radii - t_radii) * rng.uniform(-0.5, 0.5, 3)
    _ellipsoid(image, label, t_center, t_radii, TUMOR, 0.7)
    return image, label
