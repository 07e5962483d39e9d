"""Generated JPEG datasets of variable resolution, written once to a cache directory.

A :class:`JpegSpec` fixes everything about a set (count, seed, resolution distribution, number
of classes); its key names the directory, so a set is generated once and reused by every later
call, in any process. Generation writes into a temporary directory that is renamed into place,
so a half-written set is never used, and two processes generating at once both end up with
the same complete set.

Images are smooth random fields tinted by their class plus per-pixel grain, saved at quality
85-95: about 0.3-0.5 bytes per pixel, like photographs, so raw sizes follow resolution as in
real datasets. A small model can learn the class from the tint (the demo relies on it).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
"""Bumped whenever generation changes, so stale cached sets are not reused."""

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class JpegSpec:
    """What to generate.

    Attributes:
        name: a label for the set (part of its directory name).
        num_samples: number of images.
        seed: generation seed.
        median_long_side: median of the longer side, in pixels (lognormal).
        sigma: log-space standard deviation of the longer side.
        min_long_side, max_long_side: truncation of the longer side, in pixels.
        num_classes: labels are uniform in ``[0, num_classes)``.
    """

    name: str
    num_samples: int
    seed: int
    median_long_side: float
    sigma: float
    min_long_side: int
    max_long_side: int
    num_classes: int = 10

    def key(self) -> str:
        """Directory name: the set's name plus a hash of every field and the format version."""
        blob = json.dumps({**asdict(self), "v": FORMAT_VERSION}, sort_keys=True).encode()
        return f"{self.name}-{self.num_samples}-{hashlib.sha256(blob).hexdigest()[:10]}"


def default_cache_dir() -> Path:
    """Where sets go when the caller names no directory: ``$TMPDIR/headrace-workloads``."""
    return Path(tempfile.gettempdir()) / "headrace-workloads"


def ensure_jpegs(spec: JpegSpec, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding ``spec``'s images and manifest; generated first if missing."""
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    root = base / spec.key()
    if (root / MANIFEST).is_file():
        return root
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.key()}-", dir=base))
    try:
        labels = _generate(spec, tmp)
        manifest = {"spec": asdict(spec), "version": FORMAT_VERSION, "labels": labels}
        (tmp / MANIFEST).write_text(json.dumps(manifest))
        try:
            os.replace(tmp, root)
        except OSError:  # another process finished first: keep its set
            if not (root / MANIFEST).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


@dataclass(frozen=True)
class JpegSource:
    """``load(i) -> {"jpeg": bytes, "label": int, "index": i}`` from a generated set."""

    root: str
    labels: tuple[int, ...]
    key: str

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> JpegSource:
        """A source over a directory written by :func:`ensure_jpegs`."""
        manifest = json.loads((Path(root) / MANIFEST).read_text())
        return cls(str(root), tuple(manifest["labels"]), Path(root).name)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> Path:
        return Path(self.root) / f"{index:06d}.jpg"

    def load(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self.labels):
            raise IndexError(f"index {index} out of range for {len(self.labels)} images")
        return {"jpeg": self.path(index).read_bytes(), "label": self.labels[index], "index": index}

    def fingerprint(self) -> str:
        return f"jpegs:{self.key}"


def _generate(spec: JpegSpec, out: Path) -> list[int]:
    from PIL import Image

    palette = np.random.default_rng([spec.seed, 2**31]).integers(40, 216, (spec.num_classes, 3))
    labels = []
    for i in range(spec.num_samples):
        rng = np.random.default_rng([spec.seed, i])
        label = int(rng.integers(0, spec.num_classes))
        w, h = _draw_size(rng, spec)
        pixels = _draw_pixels(rng, w, h, palette[label])
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "JPEG", quality=int(rng.integers(85, 96)))
        (out / f"{i:06d}.jpg").write_bytes(buf.getvalue())
        labels.append(label)
    return labels


def _draw_size(rng: np.random.Generator, spec: JpegSpec) -> tuple[int, int]:
    """(width, height): truncated lognormal longer side, a common aspect ratio, mostly landscape."""
    while True:
        long_side = spec.median_long_side * float(np.exp(rng.normal(0.0, spec.sigma)))
        if spec.min_long_side <= long_side <= spec.max_long_side:
            break
    aspect = float(rng.choice([1.0, 4 / 3, 3 / 2, 16 / 9], p=[0.15, 0.5, 0.25, 0.1]))
    long_px, short_px = round(long_side), max(1, round(long_side / aspect))
    return (long_px, short_px) if rng.random() < 0.75 else (short_px, long_px)


def _draw_pixels(rng: np.random.Generator, w: int, h: int, tint: np.ndarray) -> np.ndarray:
    """uint8 (h, w, 3): a bicubic-upsampled coarse random field around ``tint``, plus grain."""
    from PIL import Image

    coarse = rng.normal(0.0, 50.0, (max(2, h // 32), max(2, w // 32), 3)) + tint
    coarse_u8 = np.clip(coarse, 0, 255).astype(np.uint8)
    field = np.asarray(
        Image.fromarray(coarse_u8).resize((w, h), Image.Resampling.BICUBIC), dtype=np.int16
    )
    grain = rng.integers(-1, 2, (h, w, 1), dtype=np.int16) * np.int16(rng.integers(8, 20))
    return np.clip(field + grain, 0, 255).astype(np.uint8)
