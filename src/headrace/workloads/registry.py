"""The workload registry: every workload by name, built at a chosen scale."""

from __future__ import annotations

import os
from collections.abc import Callable

from headrace.workloads.images import (
    IMAGENET_BASE_SAMPLES,
    OBJDET_BASE_SAMPLES,
    imagenet_workload,
    objdet_workload,
)
from headrace.workloads.imseg import BASE_SAMPLES as IMSEG_BASE_SAMPLES
from headrace.workloads.imseg import imseg_workload
from headrace.workloads.speech import BASE_SAMPLES as SPEECH_BASE_SAMPLES
from headrace.workloads.speech import speech_workload
from headrace.workloads.workload import Workload, scaled_count

WORKLOADS: tuple[str, ...] = ("speech-3s", "speech-10s", "imseg", "objdet", "imagenet")
"""Registered workload names, in the order benchmarks report them."""

_BASE_SAMPLES: dict[str, int] = {
    "speech-3s": SPEECH_BASE_SAMPLES,
    "speech-10s": SPEECH_BASE_SAMPLES,
    "imseg": IMSEG_BASE_SAMPLES,
    "objdet": OBJDET_BASE_SAMPLES,
    "imagenet": IMAGENET_BASE_SAMPLES,
}


def base_samples(name: str) -> int:
    """Samples per epoch of workload ``name`` at ``scale=1.0``."""
    _check_name(name)
    return _BASE_SAMPLES[name]


def get_workload(
    name: str,
    scale: float = 1.0,
    time_scale: float = 0.1,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    num_samples: int | None = None,
) -> Workload:
    """Build workload ``name`` (one of :data:`WORKLOADS`).

    Args:
        name: registered name.
        scale: factor on the number of samples per epoch (``base_samples(name) * scale``,
            at least 1); sample sizes and costs do not change with it.
        time_scale: factor on simulated times (speech's LightStep, HeavyStep and accelerator
            step); 0.1 is the papers' 1/10 scaling. Real steps are unaffected.
        seed: dataset seed: same seed, same samples.
        cache_dir: where generated files go (JPEG workloads); default
            ``$TMPDIR/headrace-workloads``. Generated once, reused afterwards.
        num_samples: exact samples per epoch; overrides ``scale``.
    """
    _check_name(name)
    n = num_samples if num_samples is not None else scaled_count(_BASE_SAMPLES[name], scale)
    if n < 1:
        raise ValueError(f"num_samples must be >= 1, got {n}")
    builders: dict[str, Callable[[], Workload]] = {
        "speech-3s": lambda: speech_workload(3.0, n, time_scale, seed),
        "speech-10s": lambda: speech_workload(10.0, n, time_scale, seed),
        "imseg": lambda: imseg_workload(n, seed),
        "objdet": lambda: objdet_workload(n, seed, cache_dir),
        "imagenet": lambda: imagenet_workload(n, seed, cache_dir),
    }
    return builders[name]()


def _check_name(name: str) -> None:
    if name not in _BASE_SAMPLES:
        raise ValueError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
