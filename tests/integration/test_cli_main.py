"""``python -m headrace.cli`` runs the ``headrace`` command (a subprocess: it is the interpreter's
``-m`` that is tested)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import headrace

pytestmark = pytest.mark.integration


def _python_m(*argv: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(headrace.__file__).parents[1])  # this checkout's, not an installed copy
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "headrace.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=120)


def test_python_m_headrace_cli_is_the_headrace_command():
    # it failed: "'headrace.cli' is a package and cannot be directly executed" (cli/__init__.py
    # had a __main__ block, which -m never runs for a package)
    done = _python_m("--version")
    assert (done.returncode, done.stdout) == (0, f"headrace {headrace.__version__}\n"), done.stderr
    done = _python_m("profile", "--samples", "0", "imseg")
    assert done.returncode == 2
    assert done.stderr.startswith("usage: headrace profile"), done.stderr
