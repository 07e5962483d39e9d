"""The loader over a profile store path that is not a usable store: it trains, leaves the file
as it was, and says where its profile went."""

import logging
import sqlite3
import subprocess
import sys

import pytest
import torch

import headrace as hr
from headrace.profiler.store import STORE_SCHEMA, ProfileStore

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


EXITS_MID_EPOCH = """
import sys
import torch
import headrace as hr

class Zeros(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.zeros(2)

loader = hr.DataLoader(Zeros(), batch_size=4, num_workers=2, persistent_workers=True,
                       options=hr.Options(profile_store=sys.argv[1]))
it = iter(loader)
for _ in range(4):
    next(it)
"""


def test_a_script_ending_inside_an_epoch_keeps_its_profile(tmp_path):
    """A script that ends with its loader inside an epoch: the profile was saved by the
    finalisers of the interpreter's teardown, with its modules going, and failed ("could not
    save the profile ... NameError: name 'open' is not defined", in 5 of 12 runs); an exit
    hook saves it first."""
    script, store = tmp_path / "train.py", tmp_path / "profiles.sqlite"
    script.write_text(EXITS_MID_EPOCH)
    for run in range(3):
        done = subprocess.run([sys.executable, str(script), str(store)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and "could not save" not in done.stderr, (run, done.stderr)
        keys = ProfileStore(store).keys()
        assert len(keys) == 1 and ProfileStore(store).get(keys[0]).samples >= 16, run
