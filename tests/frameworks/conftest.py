"""Helpers for framework tests: run a script of ``scripts/`` in a fresh Python process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parents[2]


def run_script(name: str, *args: str, timeout_s: float = 240, launcher: list[str] | None = None,
               env: dict[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``scripts/<name>`` (or the script at path ``name``; optionally under ``launcher``, e.g. torchrun) with headrace and
    the tests importable; fail the test with its output if it fails or runs past ``timeout_s``."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT),
                                              full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    cmd = [*(launcher or [sys.executable]), str(SCRIPTS / name), *args]
    try:
        proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True,
                              timeout=timeout_s, cwd=cwd or ROOT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{name} ran past {timeout_s} s:\n{e.stdout}\n{e.stderr}")
    if proc.returncode != 0:
        pytest.fail(f"{name} {' '.join(args)} exited {proc.returncode}:\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
    return proc


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())
