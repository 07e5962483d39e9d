"""The loader over a profile store path that is not a usable store: it trains, leaves the file
as it was, and says where its profile went."""

import logging

import pytest
import torch

import headrace as hr

pytestmark = pytest.mark.integration


class Zeros(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(2)


def _run(store: object) -> hr.DataLoader:
    loader = hr.DataLoader(Zeros(), batch_size=8, options=hr.Options(profile_store=store))
    assert sum(len(b) for b in loader) == 32
    loader.close()
    return loader


def test_a_users_file_named_as_the_store_is_left_alone(tmp_path, caplog):
    """``Options(profile_store=<the run's YAML>)`` unlinked the YAML and put a store in its
    place (a bug hunt); now the loader trains, warns naming the path, and keeps the file."""
    cfg = tmp_path / "train_config.yaml"
    cfg.write_text("lr: 0.1\nepochs: 90\n")
    with caplog.at_level(logging.WARNING, logger="headrace"):
        loader = _run(cfg)
    assert cfg.read_text() == "lr: 0.1\nepochs: 90\n"
    assert any(f"{cfg} is not a profile store" in r.getMessage() for r in caplog.records)
    assert f"not kept: could not read profiles from {cfg}" in loader.explain()

