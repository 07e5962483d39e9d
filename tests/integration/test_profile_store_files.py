"""The loader over a profile store path that is not a usable store: it trains, leaves the file
as it was, and says where its profile went."""

import logging
import sqlite3

import pytest
import torch

import headrace as hr
from headrace.profiler.store import STORE_SCHEMA

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


def test_explain_says_a_newer_headraces_store_kept_nothing(tmp_path, caplog):
    """A store written by a newer headrace reads as empty and is never written: explain() said
    "kept in <store>" while every save was lost (a bug hunt); now it says why not, once."""
    path = tmp_path / "newer.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {STORE_SCHEMA + 1}")
    conn.close()
    with caplog.at_level(logging.WARNING, logger="headrace"):
        loader = _run(path)
    line = next(x for x in loader.explain().splitlines() if x.startswith("profile:"))
    assert line == (f"profile: measured this run; not kept: {path} was written by a newer "
                    f"headrace (store schema {STORE_SCHEMA + 1}; this one writes {STORE_SCHEMA})")
    assert sum("newer headrace" in r.getMessage() for r in caplog.records) == 1
    assert "kept in" not in line
