"""Image sets for near-storage preprocessing (SOPHON's OpenImages and ImageNet subsets).

Synthetic and deterministic, generated with NumPy (no codec): a sample's *encoded* form is a
small header (height, width) and ``bytes_per_pixel × pixels`` bytes drawn from a generator
seeded by the set's seed and the index, so raw sizes follow resolution as JPEGs do. The
pipeline is the classic one:

* ``decode``: the pixels (``H × W × 3`` uint8, 1/``bytes_per_pixel`` ≈ 7-9x the encoded
  bytes), with CPU work proportional to the pixels (a running sum over each row);
* ``crop``: random resized crop to ``crop × crop × 3`` uint8 (224² × 3 = 150,528 bytes at
  scale 1): smaller than the encoded image when that had more than ~376 k pixels;
* ``to_float``: a float32 CHW tensor in [0, 1] (4x the crop);
* ``normalize``: per-channel mean and standard deviation.

``openimages_like``: long side median 1,000 px (σ 0.5 in log space): about three samples in
four are larger encoded than cropped, as SOPHON reports for OpenImages (76%).
``imagenet_like``: median 540 px (σ 0.45): about one in four (SOPHON: 26%).
``scale`` shrinks every length (and the crop) for quick tests.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

HEADER = 8
"""Bytes of the encoded header: height and width as two little-endian uint32."""

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


@dataclasses.dataclass(frozen=True)
class StorageImages:
    """A set of encoded images, read by index (a ``headrace`` source).

    ``median_long_side`` and ``sigma``: lognormal longer side in pixels (4:3 images, clipped
    to ``[min_long_side, max_long_side]``); ``bytes_per_pixel``: encoded bytes per pixel.
    """

    n: int
    median_long_side: float
    sigma: float
    bytes_per_pixel: float = 0.4
    min_long_side: int = 64
    max_long_side: int = 2400
    crop: int = 224
    seed: int = 0

    def __len__(self) -> int:
        return self.n

    def shape(self, i: int) -> tuple[int, int]:
        """(height, width) of image ``i``."""
        rng = np.random.default_rng((self.seed, i, 0))
        long = float(np.clip(rng.lognormal(np.log(self.median_long_side), self.sigma),
                             self.min_long_side, self.max_long_side))
        short = max(8, int(long * 3 / 4))
        return (short, int(long)) if rng.random() < 0.8 else (int(long), short)

    def load(self, i: int) -> dict[str, Any]:
        """The encoded image: ``{"i": index, "x": uint8 array (header + payload)}``."""
        h, w = self.shape(i)
        body = np.random.default_rng((self.seed, i, 1)).integers(
            0, 256, max(16, int(self.bytes_per_pixel * h * w)), dtype=np.uint8)
        head = np.array([h, w], "<u4").view(np.uint8)
        return {"i": i, "x": np.concatenate([head, body])}


def decode(s: dict[str, Any]) -> dict[str, Any]:
    """Encoded bytes -> ``H × W × 3`` uint8 pixels (CPU proportional to the pixels)."""
    x = s["x"]
    h, w = (int(v) for v in x[:HEADER].view("<u4"))
    pixels = np.resize(x[HEADER:], h * w * 3).reshape(h, w * 3)
    return {"i": s["i"], "x": np.cumsum(pixels, axis=1, dtype=np.uint8).reshape(h, w, 3)}


def crop_to(size: int) -> Any:
    """A random resized crop to ``size × size`` (scale 0.25-1 of the area, aspect 3/4-4/3,
    nearest neighbour), drawing from its ``rng``."""

    def crop(s: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        x = s["x"]
        h, w = x.shape[:2]
        area = h * w * rng.uniform(0.25, 1.0)
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        ch = int(min(h, max(1, round(np.sqrt(area / ratio)))))
        cw = int(min(w, max(1, round(np.sqrt(area * ratio)))))
        top = int(rng.integers(0, h - ch + 1))
        left = int(rng.integers(0, w - cw + 1))
        rows = top + (np.arange(size) * ch) // size
        cols = left + (np.arange(size) * cw) // size
        return {"i": s["i"], "x": np.ascontiguousarray(x[rows][:, cols])}

    crop.__name__ = "crop"
    return crop


def to_float(s: dict[str, Any]) -> dict[str, Any]:
    """uint8 HWC -> float32 CHW tensor in [0, 1]."""
    t = torch.from_numpy(s["x"]).permute(2, 0, 1).to(torch.float32).div_(255.0)
    return {"i": s["i"], "x": t}


def normalize(s: dict[str, Any]) -> dict[str, Any]:
    """Per-channel (x - mean) / std."""
    mean = torch.from_numpy(MEAN).view(3, 1, 1)
    std = torch.from_numpy(STD).view(3, 1, 1)
    return {"i": s["i"], "x": (s["x"] - mean) / std}


def openimages_like(n: int, scale: float = 1.0, seed: int = 0) -> StorageImages:
    """Variable, often large images: most shrink when decoded and cropped."""
    return StorageImages(n, 1000 * scale, 0.5, min_long_side=max(8, int(64 * scale)),
                         max_long_side=int(2400 * scale), crop=max(4, int(224 * scale)),
                         seed=seed)


def imagenet_like(n: int, scale: float = 1.0, seed: int = 0) -> StorageImages:
    """Smaller images: most are smallest encoded."""
    return StorageImages(n, 540 * scale, 0.45, min_long_side=max(8, int(64 * scale)),
                         max_long_side=int(2400 * scale), crop=max(4, int(224 * scale)),
                         seed=seed)


def pipeline(images: StorageImages) -> Any:
    """The pipeline over ``images``: load -> decode -> crop -> to_float -> normalize."""
    import headrace as hr

    return hr.Pipeline(images, [hr.step(decode, name="decode", kind="decode"),
                                hr.step(crop_to(images.crop), name="crop", random=True),
                                hr.step(to_float, name="to_float"),
                                hr.step(normalize, name="normalize", keep_position=True)])
