"""The speech microbenchmark of MinatoLoader (Table 1, "Speech-3s" / "Speech-10s").

Synthetic utterances of 1-3 s at 16 kHz go through RNN-T's preprocessing as real NumPy/SciPy
steps (Pad, SpecAugment, FilterBank, FrameSplicing, PermuteAudio, a few ms in all), then two
simulated steps that sleep: LightStep (0.5 s × time_scale) on every sample and HeavyStep
(3 s or 10 s × time_scale) on every 5th sample by dataset index. The sleeps dominate, so the
workload stresses scheduling rather than the machine's cores.

Samples are dicts; the final one is ``{"features": float32 (100, 240), "length": int,
"index": int}`` (``length`` is the utterance's length in audio samples before padding).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from headrace.pipeline import Pipeline, step
from headrace.workloads.audio import log_mel, spectral_band_mask, splice_frames, synth_utterance
from headrace.workloads.workload import Workload

Sample = dict[str, Any]

SAMPLE_RATE = 16_000
"""Audio sample rate in Hz."""

BASE_SAMPLES = 1200
"""Samples at ``scale=1.0``: 50 batches of 24."""

ACCELERATOR_STEP_S = 1.5
"""Simulated RNN-T training step per batch of 24, in seconds at ``time_scale=1``."""


@dataclass(frozen=True)
class SpeechSource:
    """Synthetic utterances, ``load(i) -> {"audio": float32 (n,), "index": i}``.

    The length is uniform in ``[min_s, max_s]`` seconds; content and length are a pure function
    of ``(seed, index)``, so any process loads the same utterance.
    """

    num_samples: int
    seed: int = 0
    min_s: float = 1.0
    max_s: float = 3.0
    sample_rate: int = SAMPLE_RATE

    def __len__(self) -> int:
        return self.num_samples

    def load(self, index: int) -> Sample:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"index {index} out of range for {self.num_samples} utterances")
        rng = np.random.default_rng([self.seed, index])
        n = int(rng.uniform(self.min_s, self.max_s) * self.sample_rate)
        return {"audio": synth_utterance(rng, n, self.sample_rate), "index": index}

    def fingerprint(self) -> str:
        return f"speech:{self.num_samples}:{self.seed}:{self.min_s}:{self.max_s}:{self.sample_rate}"


@dataclass(frozen=True)
class Pad:
    """Zero-pad the waveform to ``max_samples`` (inflationary: every sample grows to the max)."""

    max_samples: int

    def __call__(self, s: Sample) -> Sample:
        audio = s["audio"][: self.max_samples]
        out = np.zeros(self.max_samples, dtype=np.float32)
        out[: audio.shape[0]] = audio
        return {"audio": out, "length": int(audio.shape[0]), "index": s["index"]}


@dataclass(frozen=True)
class SpecAugment:
    """Random frequency and time masking, applied to the waveform (it runs before FilterBank).

    ``freq_masks`` bands of up to ``max_band_hz`` are removed in the spectral domain and
    ``time_masks`` spans of up to ``max_span_s`` seconds are zeroed, within the utterance.
    """

    sample_rate: int = SAMPLE_RATE
    freq_masks: int = 2
    max_band_hz: float = 600.0
    time_masks: int = 2
    max_span_s: float = 0.1

    def __call__(self, s: Sample, rng: np.random.Generator) -> Sample:
        nyquist = self.sample_rate / 2
        bands = []
        for _ in range(self.freq_masks):
            width = rng.uniform(0.0, self.max_band_hz)
            lo = rng.uniform(0.0, nyquist - width)
            bands.append((lo, lo + width))
        audio = spectral_band_mask(s["audio"], bands, self.sample_rate)
        length = s["length"]
        for _ in range(self.time_masks):
            span = int(rng.uniform(0.0, self.max_span_s) * self.sample_rate)
            start = int(rng.integers(0, max(1, length - span)))
            audio[start : start + span] = 0.0
        audio[length:] = 0.0  # keep the padding silent
        return {**s, "audio": audio}


@dataclass(frozen=True)
class FilterBank:
    """Waveform → normalized log-mel features ``(n_mels, frames)`` (20 ms windows, 10 ms hop)."""

    sample_rate: int = SAMPLE_RATE
    n_mels: int = 80

    def __call__(self, s: Sample) -> Sample:
        feats = log_mel(s["audio"], self.sample_rate, n_mels=self.n_mels)
        return {"features": feats, "length": s["length"], "index": s["index"]}


@dataclass(frozen=True)
class FrameSplicing:
    """Stack 3 frames, keep every 3rd: ``(F, T)`` → ``(3F, T//3)``."""

    stack: int = 3
    subsample: int = 3

    def __call__(self, s: Sample) -> Sample:
        return {**s, "features": splice_frames(s["features"], self.stack, self.subsample)}


def permute_audio(s: Sample) -> Sample:
    """Features ``(F, T)`` → time-major ``(T, F)``, contiguous (RNN-T's PermuteAudio)."""
    return {**s, "features": np.ascontiguousarray(s["features"].T)}


@dataclass(frozen=True)
class LightStep:
    """Simulated light preprocessing: sleeps ``seconds`` on every sample, data unchanged."""

    seconds: float

    def __call__(self, s: Sample) -> Sample:
        time.sleep(self.seconds)
        return s


@dataclass(frozen=True)
class HeavyStep:
    """Simulated heavy preprocessing: sleeps ``seconds`` when ``index % every == 0``, else nothing."""

    seconds: float
    every: int = 5

    def __call__(self, s: Sample) -> Sample:
        if s["index"] % self.every == 0:
            time.sleep(self.seconds)
        return s


def is_heavy(index: int, every: int = 5) -> bool:
    """Whether sample ``index`` runs HeavyStep (the deterministic "about every 5th")."""
    return index % every == 0


def speech_workload(
    heavy_s: float,
    num_samples: int = BASE_SAMPLES,
    time_scale: float = 0.1,
    seed: int = 0,
    num_workers: int = 12,
    accelerator_step_s: float | None = None,
) -> Workload:
    """MinatoLoader's speech microbenchmark with a HeavyStep of ``heavy_s`` seconds (3 or 10).

    Args:
        heavy_s: HeavyStep duration at ``time_scale=1``, in seconds.
        num_samples: utterances per epoch.
        time_scale: factor on the simulated times (LightStep, HeavyStep, accelerator step);
            0.1 reproduces the paper's 1/10 scaling (LightStep 50 ms, HeavyStep 300 ms / 1 s).
        seed: dataset seed (utterance content and lengths).
        num_workers: worker budget (the paper's 12).
        accelerator_step_s: simulated step per batch in seconds; default
            ``ACCELERATOR_STEP_S * time_scale``.
    """
    if time_scale < 0:
        raise ValueError(f"time_scale must be >= 0, got {time_scale}")
    max_samples = int(3.0 * SAMPLE_RATE)
    steps = [
        step(Pad(max_samples), name="Pad"),
        step(SpecAugment(), name="SpecAugment", random=True, kind="augment"),
        step(FilterBank(), name="FilterBank"),
        step(FrameSplicing(), name="FrameSplicing"),
        step(permute_audio, name="PermuteAudio"),
        step(LightStep(0.5 * time_scale), name="LightStep"),
        step(HeavyStep(heavy_s * time_scale), name="HeavyStep"),
    ]
    name = f"speech-{heavy_s:g}s"
    step_s = ACCELERATOR_STEP_S * time_scale if accelerator_step_s is None else accelerator_step_s
    return Workload(
        name=name,
        pipeline=Pipeline(SpeechSource(num_samples, seed), steps),
        batch_size=24,
        num_workers=num_workers,
        accelerator_step_s=step_s,
        description=(
            f"MinatoLoader {name} microbenchmark: {num_samples} synthetic 1-3 s utterances at "
            f"16 kHz; Pad, SpecAugment, FilterBank, FrameSplicing, PermuteAudio (real NumPy, "
            f"a few ms), LightStep {0.5 * time_scale * 1e3:g} ms on every sample, HeavyStep "
            f"{heavy_s * time_scale * 1e3:g} ms on every 5th (index % 5 == 0); batch 24, "
            f"{num_workers} workers, accelerator step {step_s * 1e3:g} ms per batch."
        ),
    )
