"""Image steps with Pillow and NumPy: the torchvision transforms an image pipeline uses.

Samples are dicts: ``{"jpeg": bytes, ...}`` before Decode, ``{"image": uint8 (H, W, 3), ...}``
after it, ``{"image": float32 (3, H, W), ...}`` after ToTensor. Other entries ride along.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

Sample = dict[str, Any]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def decode(s: Sample) -> Sample:
    """JPEG bytes → RGB uint8 array ``(H, W, 3)``; the bytes are dropped."""
    with Image.open(io.BytesIO(s["jpeg"])) as im:
        image = np.asarray(im.convert("RGB"))
    out = {k: v for k, v in s.items() if k != "jpeg"}
    out["image"] = image
    return out


def _resize(image: np.ndarray, size: tuple[int, int], box: tuple[int, int, int, int]) -> np.ndarray:
    """Bilinear resize of ``image[top:bottom, left:right]`` to ``size`` = (width, height)."""
    left, top, right, bottom = box
    region = Image.fromarray(np.ascontiguousarray(image[top:bottom, left:right]))
    return np.asarray(region.resize(size, Image.Resampling.BILINEAR))


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop: a random box of ``scale`` area and ``ratio`` aspect,
    resized to ``size × size`` (bilinear). Falls back to a center crop after 10 tries."""

    size: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        image = s["image"]
        box = self._box(image.shape[0], image.shape[1], rng)
        return {**s, "image": _resize(image, (self.size, self.size), box)}

    def _box(self, h: int, w: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        area = h * w
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            cw = round(math.sqrt(target * aspect))
            ch = round(math.sqrt(target / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                top = int(rng.integers(0, h - ch + 1))
                left = int(rng.integers(0, w - cw + 1))
                return left, top, left + cw, top + ch
        in_ratio = w / h  # fallback: the largest central box within the ratio range
        if in_ratio < self.ratio[0]:
            cw, ch = w, round(w / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            ch, cw = h, round(h * self.ratio[1])
        else:
            cw, ch = w, h
        top, left = (h - ch) // 2, (w - cw) // 2
        return left, top, left + cw, top + ch


@dataclass(frozen=True)
class Resize:
    """Resize the shorter side to ``size`` (bilinear), then center-crop ``crop × crop``.

    torchvision's ``Resize(size)`` + ``CenterCrop(crop)`` in one pass: only the pixels that
    survive the crop are resampled.
    """

    size: int = 256
    crop: int = 224

    def __call__(self, s: Sample) -> Sample:
        image = s["image"]
        h, w = image.shape[:2]
        factor = self.size / min(h, w)
        side = self.crop / factor  # the crop, in input pixels
        left, top = (w - side) / 2, (h - side) / 2
        box = (round(left), round(top), round(left + side), round(top + side))
        return {**s, "image": _resize(image, (self.crop, self.crop), box)}


@dataclass(frozen=True)
class Flip:
    """Horizontal flip with probability ``p``."""

    p: float = 0.5

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        if rng.random() >= self.p:
            return s
        return {**s, "image": np.ascontiguousarray(s["image"][:, ::-1])}


def to_tensor(s: Sample) -> Sample:
    """uint8 ``(H, W, 3)`` → float32 ``(3, H, W)`` in [0, 1] (torchvision's ToTensor, NumPy out)."""
    image = s["image"].transpose(2, 0, 1).astype(np.float32)
    image *= np.float32(1 / 255)
    return {**s, "image": image}


@dataclass(frozen=True)
class Normalize:
    """Per-channel ``(x - mean) / std`` on a float32 ``(3, H, W)`` image."""

    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __call__(self, s: Sample) -> Sample:
        mean = np.asarray(self.mean, dtype=np.float32)[:, None, None]
        inv = (1 / np.asarray(self.std, dtype=np.float32))[:, None, None]
        return {**s, "image": (s["image"] - mean) * inv}
