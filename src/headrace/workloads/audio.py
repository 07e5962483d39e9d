"""Audio signal processing in NumPy: synthetic utterances, log-mel filterbanks, frame splicing.

The building blocks of the speech workload (MLPerf RNN-T preprocessing, as MinatoLoader runs
it). Arrays are float32; sample rates in Hz; lengths in samples unless a name says otherwise.
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.fft
from scipy import signal

__all__ = [
    "log_mel",
    "mel_filterbank",
    "spectral_band_mask",
    "splice_frames",
    "synth_utterance",
]


def synth_utterance(rng: np.random.Generator, n_samples: int, sample_rate: int) -> np.ndarray:
    """A speech-like waveform in [-1, 1]: a voiced harmonic source shaped by formant filters.

    Pitch (90-250 Hz) glides slowly, syllables come at about 4 Hz, and a little noise is mixed
    in. Deterministic given ``rng``; costs about 0.5 ms per second of audio.
    """
    t = np.arange(n_samples, dtype=np.float32) / np.float32(sample_rate)
    f0, rate = rng.uniform(90.0, 250.0), rng.uniform(0.2, 1.0)
    # instantaneous pitch f0 * (1 + 0.1 sin(2 pi rate t)), integrated in closed form
    wobble = np.cos(np.float32(2 * np.pi * rate) * t) * np.float32(-0.1 / (2 * np.pi * rate))
    phase = np.float32(2 * np.pi * f0) * (t + wobble)
    voiced = np.sin(phase)
    for h in range(2, 5):
        voiced += np.sin(np.float32(h) * phase) / np.float32(h)
    voiced += rng.standard_normal(n_samples, dtype=np.float32) * np.float32(0.05)
    b, a = signal.iirpeak(rng.uniform(500.0, 900.0), 4.0, fs=sample_rate)  # first formant
    x = signal.lfilter(b, a, voiced).astype(np.float32)
    envelope = np.sin(np.float32(np.pi * rng.uniform(3.0, 5.0)) * t)  # syllables at 3-5 Hz
    envelope *= envelope
    x *= envelope
    x *= envelope
    peak = float(np.max(np.abs(x))) or 1.0
    return (0.9 / peak) * x


def spectral_band_mask(
    audio: np.ndarray, bands: list[tuple[float, float]], sample_rate: int
) -> np.ndarray:
    """Zero the frequency bands ``[(lo_hz, hi_hz), ...]`` of a waveform (FFT, mask, inverse FFT)."""
    spec = scipy.fft.rfft(audio)
    bin_hz = sample_rate / audio.shape[-1]
    for lo, hi in bands:
        spec[int(np.ceil(lo / bin_hz)) : int(np.ceil(hi / bin_hz))] = 0
    return scipy.fft.irfft(spec, n=audio.shape[-1]).astype(np.float32)


@functools.lru_cache(maxsize=8)
def mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """Triangular mel filters (HTK mel scale, area-normalized), shape ``(n_mels, n_fft//2 + 1)``.

    Cached per process: the matrix is built once (about 1 ms) and shared by every sample.
    """
    fmax = sample_rate / 2 if fmax is None else fmax

    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    mels = np.linspace(hz_to_mel(np.array(fmin)), hz_to_mel(np.array(fmax)), n_mels + 2)
    edges = mel_to_hz(mels)
    freqs = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    lower = (freqs[None, :] - edges[:-2, None]) / (edges[1:-1] - edges[:-2])[:, None]
    upper = (edges[2:, None] - freqs[None, :]) / (edges[2:] - edges[1:-1])[:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    out = weights.astype(np.float32)
    out.setflags(write=False)  # shared by every caller through the cache
    return out


def log_mel(
    audio: np.ndarray,
    sample_rate: int,
    n_fft: int = 512,
    win_length: int = 320,
    hop_length: int = 160,
    n_mels: int = 80,
    preemphasis: float = 0.97,
) -> np.ndarray:
    """Log-mel filterbank features, normalized per feature, shape ``(n_mels, frames)``.

    As in RNN-T's ``FilterbankFeatures``: pre-emphasis, centered STFT with a Hann window of
    ``win_length`` samples (20 ms at 16 kHz) every ``hop_length`` samples (10 ms), power
    spectrum, mel filters, log, then zero mean and unit variance per mel band.
    ``frames = 1 + len(audio) // hop_length``.
    """
    x = np.concatenate([audio[:1], audio[1:] - preemphasis * audio[:-1]]).astype(np.float32)
    x = np.pad(x, n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop_length]
    window = np.zeros(n_fft, dtype=np.float32)
    left = (n_fft - win_length) // 2
    window[left : left + win_length] = signal.get_window("hann", win_length).astype(np.float32)
    spec = scipy.fft.rfft(frames * window, axis=-1)
    power = spec.real**2 + spec.imag**2
    mel = mel_filterbank(sample_rate, n_fft, n_mels) @ power.T
    feat = np.log(mel + 2.0**-24)
    feat -= feat.mean(axis=1, keepdims=True)
    feat /= feat.std(axis=1, keepdims=True) + 1e-5
    return feat.astype(np.float32)


def splice_frames(features: np.ndarray, stack: int = 3, subsample: int = 3) -> np.ndarray:
    """Stack ``stack`` consecutive frames and keep every ``subsample``-th: ``(F, T)`` → ``(F*stack, T//subsample)``.

    RNN-T's ``FrameSplicing``: fewer, wider frames for the encoder. Frames past the end are
    zero; a trailing partial group is dropped.
    """
    n_feat, n_frames = features.shape
    out_frames = n_frames // subsample
    padded = np.pad(features, ((0, 0), (0, stack)))
    starts = np.arange(out_frames) * subsample
    parts = [padded[:, starts + k] for k in range(stack)]
    return np.concatenate(parts, axis=0).astype(np.float32)
