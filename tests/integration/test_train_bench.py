"""``headrace train`` in its tiny CPU form (the GPU form is the same code with NVML on)."""

import json

import pytest
import torch

from headrace.bench.gpu_util import UtilizationSampler, mean_between, nvml_available
from headrace.bench.models import ResNet, SpeechLSTM, UNet3D
from headrace.bench.train import TrainConfig, run_train, speech_label
from headrace.cli import main

pytestmark = pytest.mark.integration


def test_models_shapes():
    assert ResNet(10, width=4, blocks=1)(torch.zeros(2, 3, 224, 224)).shape == (2, 10)
    assert UNet3D(3, width=4, depth=2)(torch.zeros(2, 1, 40, 40, 40)).shape == (2, 3, 40, 40, 40)
    assert SpeechLSTM(4, width=8, layers=1)(torch.zeros(2, 100, 240)).shape == (2, 4)


def test_speech_label_is_the_duration_quarter():
    # 16 kHz: 1.0 s and 1.49 s are in the first quarter of [1, 3] s, 2.0 s starts the third,
    # 3.0 s (the longest utterance) is in the last
    lengths = torch.tensor([16_000, 23_840, 24_000, 32_000, 47_999, 48_000])
    assert speech_label(lengths).tolist() == [0, 0, 1, 2, 3, 3]


def test_mean_between_and_sampler_refusal():
    samples = [(0.05, 10), (0.15, 50), (0.25, 90)]
    assert mean_between(samples, 0.1, 0.3) == 70
    assert mean_between(samples, 1.0, 2.0) is None
    if not nvml_available():
        with pytest.raises(RuntimeError, match=r"headrace\[gpu\]"):
            UtilizationSampler(torch.device("cuda")).start()


@pytest.mark.heavy_imports  # its torch optimizers import torch._dynamo and sympy
def test_tiny_training_run_on_cpu(tmp_path, no_leaks):
    # the model alone is timed on one step, unwarmed: the defaults' 13 steps per workload
    # cost more than the 8 steps of training that the assertions below are about
    cfg = TrainConfig(workloads=("imseg", "imagenet", "speech-3s"), samples=6, epochs=2,
                      workers=1, device="cpu", out_dir=str(tmp_path / "out"),
                      cache_dir=str(tmp_path), model_warmup=0, model_steps=1)
    runs = run_train(cfg, log=lambda _m: None)
    assert [(r.workload, r.loader) for r in runs] == [
        ("imseg", "torch"), ("imseg", "headrace"), ("imagenet", "torch"), ("imagenet", "headrace"),
        ("speech-3s", "torch"), ("speech-3s", "headrace")]
    batches = {"imseg": 3, "imagenet": 64, "speech-3s": 24}
    for r in runs:
        assert r.samples == [6, 6]  # every sample of the epoch trained on, each epoch
        assert [len(x) for x in r.losses] == [-(-6 // batches[r.workload])] * 2
        assert all(v == v and v > 0 for x in r.losses for v in x)  # finite, positive losses
        assert r.utilization == [] and r.mean_utilization == [None, None]  # no NVML on the CPU
        assert len(r.epoch_s) == 2 and all(s > 0 for s in r.epoch_s)
        assert r.model.step_s > 0 and r.model.utilization is None
        # the loop's thread is part of the process: its CPU cannot exceed the process's
        assert all(0 < c <= p for c, p in zip(r.loop_cpu_s, r.process_cpu_s, strict=True))
    doc = json.loads((tmp_path / "out" / "train.json").read_text())
    assert doc["device"] == "cpu" and len(doc["runs"]) == 6
    table = (tmp_path / "out" / "train.md").read_text()
    assert "| imseg | headrace |" in table and "| speech-3s | torch |" in table


def test_train_config_refuses_an_untimed_model_step():
    with pytest.raises(ValueError, match="model_steps"):
        TrainConfig(model_steps=0)  # ModelStep.step_s would be the median of nothing
    with pytest.raises(ValueError, match="model_warmup"):
        TrainConfig(model_warmup=-1)


def test_cli_train_rejects_unknown_workload(tmp_path, capsys):
    assert main(["train", "objdet", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "no model for workload(s) objdet" in capsys.readouterr().err
