"""GPU utilization over time, sampled through NVML while a training run goes on.

NVML's utilization is the percent of its last sample period (1/6 s to 1 s depending on the
GPU) during which at least one kernel was running: MinatoLoader's headline metric (46% with
torch's DataLoader, ~90% with sample-aware loading). Read through ``torch.cuda.utilization``,
which maps the CUDA device index to NVML's (``CUDA_VISIBLE_DEVICES`` included) and needs
``nvidia-ml-py`` (the ``headrace[gpu]`` extra), imported only when a sampler starts.
"""

from __future__ import annotations

import importlib.util
import threading
import time

import torch


def nvml_available() -> bool:
    """Whether GPU utilization can be sampled here: CUDA present and ``pynvml`` importable."""
    return torch.cuda.is_available() and importlib.util.find_spec("pynvml") is not None


class UtilizationSampler:
    """Samples ``(seconds since start, utilization %)`` every ``interval_s`` seconds in a thread.

    ``device``: the CUDA device measured. Use as a context manager, or ``start`` / ``stop``.
    """

    def __init__(self, device: torch.device, interval_s: float = 0.1) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.device = device
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def start(self) -> UtilizationSampler:
        if not nvml_available():
            raise RuntimeError("GPU utilization needs CUDA and nvidia-ml-py: "
                               "pip install 'headrace[gpu]'")
        torch.cuda.utilization(self.device)  # fail here, not silently in the thread
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="headrace-nvml", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        return self.samples

    def __enter__(self) -> UtilizationSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append((time.perf_counter() - self._t0,
                                 int(torch.cuda.utilization(self.device))))


def mean_between(samples: list[tuple[float, int]], t_from: float, t_to: float) -> float | None:
    """Mean utilization (%) of the samples taken in ``[t_from, t_to]`` (seconds since start)."""
    window = [u for t, u in samples if t_from <= t <= t_to]
    return sum(window) / len(window) if window else None
