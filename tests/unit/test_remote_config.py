"""``hr.Remote`` and ``Options(remote=...)``: validation, and no Ray without a Remote."""

import subprocess
import sys
from pathlib import Path

import pytest

import headrace as hr

ROOT = Path(__file__).resolve().parents[2]


def test_validation():
    with pytest.raises(ValueError, match="max_workers"):
        hr.Remote(max_workers=-1)
    with pytest.raises(ValueError, match="workers"):
        hr.Remote(workers=3, max_workers=2)
    with pytest.raises(ValueError, match="cost_per_worker_hour"):
        hr.Remote(cost_per_worker_hour=-1.0)
    with pytest.raises(ValueError, match="threshold"):
        hr.Remote(threshold=1.5)
    with pytest.raises(ValueError, match="headrace.Remote"):
        hr.Options(remote="auto")  # type: ignore[arg-type]


def test_remote_needs_worker_processes_or_threads():
    with pytest.raises(ValueError, match="num_workers >= 1"):
        hr.DataLoader(list(range(4)), num_workers=0, options=hr.Options(remote=hr.Remote()))


def test_nothing_of_ray_is_imported_without_a_remote():
    code = ("import sys, headrace as hr\n"
            "l = hr.DataLoader(list(range(8)), batch_size=4, num_workers=1)\n"
            "assert len(list(l)) == 2\n"
            "print('ray' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin"})
    assert out.stdout.strip() == "False", out.stderr
