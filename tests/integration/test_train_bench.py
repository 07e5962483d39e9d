"""``headrace train`` in its tiny CPU form (the GPU form is the same code with NVML on)."""

import json

import pytest
import torch

from headrace.bench.gpu_util import UtilizationSampler, mean_between, nvml_available
from headrace.bench.models import ResNet, UNet3D
from headrace.bench.train import TrainConfig, run_train
from headrace.cli import main

pytestmark = pytest.mark.integration


def test_models_shapes():
    assert ResNet(10, width=4, blocks=1)(torch.zeros(2, 3, 224, 224)).shape == (2, 10)
    assert UNet3D(3, width=4, depth=2)(torch.zeros(2, 1, 40, 40, 40)).shape == (2, 3, 40, 40, 40)


def test_mean_between_and_sampler_refusal():
    samples = [(0.05, 10), (0.15, 50), (0.25, 90)]
    assert mean_between(samples, 0.1, 0.3) == 70
    assert mean_between(samples, 1.0, 2.0) is None
    if not nvml_available():
        with pytest.raises(RuntimeError, match=r"headrace\[gpu\]"):
            UtilizationSampler(torch.device("cuda")).start()


def test_tiny_training_run_on_cpu(tmp_path, no_leaks):
    cfg = TrainConfig(workloads=("imseg", "imagenet"), samples=6, epochs=2, workers=1,
                      device="cpu", out_dir=str(tmp_path / "out"), cache_dir=str(tmp_path))
    runs = run_train(cfg, log=lambda _m: None)
    assert [(r.workload, r.loader) for r in runs] == [
        ("imseg", "torch"), ("imseg", "headrace"), ("imagenet", "torch"), ("imagenet", "headrace")]
    for r in runs:
        assert r.samples == [6, 6]  # every sample of the epoch trained on, each epoch
        batch = 3 if r.workload == "imseg" else 64
        assert [len(x) for x in r.losses] == [-(-6 // batch)] * 2
        assert all(v == v and v > 0 for x in r.losses for v in x)  # finite, positive losses
        assert r.utilization == [] and r.mean_utilization == [None, None]  # no NVML on the CPU
        assert len(r.epoch_s) == 2 and all(s > 0 for s in r.epoch_s)
    doc = json.loads((tmp_path / "out" / "train.json").read_text())
    assert doc["device"] == "cpu" and len(doc["runs"]) == 4
    assert "| imseg | headrace |" in (tmp_path / "out" / "train.md").read_text()


def test_cli_train_rejects_unknown_workload(tmp_path):
    with pytest.raises(ValueError, match="no model"):
        main(["train", "speech-3s", "--device", "cpu", "--out", str(tmp_path)])
