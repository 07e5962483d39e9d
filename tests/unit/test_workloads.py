"""Workloads build at a tiny scale, produce the documented samples, and are deterministic."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from headrace.workloads import WORKLOADS, base_samples, get_workload, is_heavy
from headrace.workloads import jpegs as jpegs_mod
from headrace.workloads import speech as speech_mod
from headrace.workloads.images import imagenet_spec
from headrace.workloads.jpegs import ensure_jpegs
from headrace.workloads.volumes import VolumeSource

TINY = {"speech-3s": 6, "speech-10s": 6, "imseg": 4, "objdet": 6, "imagenet": 6}
EXPECTED = {
    "speech-3s": {"features": ((100, 240), np.float32)},
    "speech-10s": {"features": ((100, 240), np.float32)},
    "imseg": {"image": ((1, 40, 40, 40), np.float32), "label": ((1, 40, 40, 40), np.uint8)},
    "objdet": {"image": ((3, 224, 224), np.float32)},
    "imagenet": {"image": ((3, 224, 224), np.float32)},
}
TIME_SCALE = 0.001  # sleeps of 0.5 ms to 10 ms: negligible


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workloads")


def build(name: str, cache_dir: Path, seed: int = 0, **kw):
    return get_workload(
        name, num_samples=TINY[name], time_scale=TIME_SCALE, seed=seed, cache_dir=cache_dir, **kw
    )


@pytest.mark.parametrize("name", WORKLOADS)
def test_samples_have_the_documented_shapes(name: str, cache_dir: Path):
    wl = build(name, cache_dir)
    assert wl.name == name and len(wl) == TINY[name] and wl.description
    assert wl.batch_size >= 1 and wl.num_workers >= 1 and wl.accelerator_step_s > 0
    for i in range(len(wl)):
        sample = wl.pipeline[i]
        assert sample["index"] == i
        for key, (shape, dtype) in EXPECTED[name].items():
            assert sample[key].shape == shape and sample[key].dtype == dtype, key
            assert np.isfinite(sample[key]).all()


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_content_other_seed_other_content(name: str, cache_dir: Path):
    a, b = build(name, cache_dir), build(name, cache_dir)
    other = build(name, cache_dir, seed=1)
    key = next(iter(EXPECTED[name]))
    for i in range(3):
        np.testing.assert_array_equal(a.pipeline[i][key], b.pipeline[i][key])
    assert any(not np.array_equal(a.pipeline[i][key], other.pipeline[i][key]) for i in range(3))
    assert a.pipeline.fingerprint() == b.pipeline.fingerprint()


@pytest.mark.parametrize("name", WORKLOADS)
def test_workload_pickles_and_torch_dataloader_collates_it(name: str, cache_dir: Path):
    wl = pickle.loads(pickle.dumps(build(name, cache_dir)))
    loader = torch.utils.data.DataLoader(wl.pipeline, batch_size=2, num_workers=0)
    batch = next(iter(loader))
    assert batch["index"].tolist() == [0, 1]
    key, (shape, _) = next(iter(EXPECTED[name].items()))
    assert tuple(batch[key].shape) == (2, *shape)


def test_heavy_step_runs_on_every_fifth_sample_by_index(monkeypatch: pytest.MonkeyPatch):
    slept: list[tuple[int, float]] = []
    current = {"index": -1}

    class FakeTime:
        @staticmethod
        def sleep(seconds: float) -> None:
            slept.append((current["index"], seconds))

    monkeypatch.setattr(speech_mod, "time", FakeTime)
    wl = get_workload("speech-10s", num_samples=11, time_scale=0.1)
    for i in range(11):
        current["index"] = i
        wl.pipeline[i]
    light = [i for i, s in slept if s == pytest.approx(0.05)]
    heavy = [i for i, s in slept if s == pytest.approx(1.0)]
    assert light == list(range(11))
    assert heavy == [0, 5, 10] == [i for i in range(11) if is_heavy(i)]
    assert len(slept) == 14


def test_time_scale_scales_simulated_times_only():
    fast = get_workload("speech-3s", num_samples=2, time_scale=0.01)
    slow = get_workload("speech-3s", num_samples=2, time_scale=0.1)
    assert slow.accelerator_step_s == pytest.approx(10 * fast.accelerator_step_s)
    assert fast.pipeline.fingerprint() != slow.pipeline.fingerprint()
    np.testing.assert_array_equal(
        fast.pipeline.source.load(1)["audio"], slow.pipeline.source.load(1)["audio"]
    )


def raw_vs_cropped_bytes(name: str, n: int, cache_dir: Path) -> list[tuple[int, int]]:
    """(JPEG bytes, bytes after the workload's Decode + crop steps) per image."""
    wl = get_workload(name, num_samples=n, cache_dir=cache_dir)
    decode_step, crop_step = wl.pipeline.steps[:2]
    assert decode_step.kind == "decode"
    out = []
    for i in range(n):
        raw = wl.pipeline.source.load(i)
        cropped = crop_step(decode_step(raw), np.random.default_rng(i))["image"]
        assert cropped.shape == (224, 224, 3) and cropped.dtype == np.uint8
        out.append((len(raw["jpeg"]), cropped.nbytes))
    return out


def test_objdet_mostly_shrinks_and_imagenet_mostly_grows(cache_dir: Path):
    n = 32
    big = raw_vs_cropped_bytes("objdet", n, cache_dir)
    small = raw_vs_cropped_bytes("imagenet", n, cache_dir)
    shrink_big = sum(raw > crop for raw, crop in big) / n
    grow_small = sum(raw < crop for raw, crop in small) / n
    assert shrink_big >= 0.6, shrink_big  # SOPHON §2: 76% of OpenImages shrink
    assert grow_small >= 0.6, grow_small  # and 74% of ImageNet grow


def test_random_resized_crop_output_is_fixed_whatever_the_input(cache_dir: Path):
    from headrace.workloads.vision import RandomResizedCrop

    crop = RandomResizedCrop(224)
    for h, w in [(50, 400), (224, 224), (900, 120), (1200, 1600)]:
        img = np.zeros((h, w, 3), dtype=np.uint8)
        for seed in range(5):
            out = crop({"image": img}, np.random.default_rng(seed))["image"]
            assert out.shape == (224, 224, 3)


def test_generated_jpegs_are_reused(cache_dir: Path, monkeypatch: pytest.MonkeyPatch):
    spec = imagenet_spec(3, seed=7)
    root = ensure_jpegs(spec, cache_dir)

    def boom(*_a, **_k):
        raise AssertionError("regenerated a cached set")

    monkeypatch.setattr(jpegs_mod, "_generate", boom)
    assert ensure_jpegs(spec, cache_dir) == root
    assert sorted(p.name for p in root.iterdir()) == [
        "000000.jpg",
        "000001.jpg",
        "000002.jpg",
        "manifest.json",
    ]


def test_volume_sizes_are_heavy_tailed_within_bounds():
    src = VolumeSource(400, seed=0)
    mb = np.array([np.prod(src.shape(i)) * 4 / 1e6 for i in range(len(src))])
    assert mb.min() >= 0.45 and mb.max() <= 8.5  # rounding of the sides moves sizes a little
    assert mb.mean() > np.median(mb)  # right-skewed
    assert np.percentile(mb, 90) > 2 * np.median(mb) * 0.9


def test_registry_scales_sample_counts_and_rejects_unknown_names():
    assert len(get_workload("imseg", scale=0.01)) == round(base_samples("imseg") * 0.01)
    assert len(get_workload("speech-3s", scale=1e-9)) == 1
    with pytest.raises(ValueError, match="unknown workload"):
        get_workload("mnist")
    with pytest.raises(ValueError):
        get_workload("imseg", scale=0)
