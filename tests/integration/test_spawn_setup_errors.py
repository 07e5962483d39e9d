"""A spawned (or forkserver) worker that cannot import its dataset's class says what failed:
the class, its module and the import error, and mentions the ``__main__`` guard only where the
guard is the likely cause (``runtime/sent_setup.py``). Real spawned workers, bounded: one
worker, a few samples, each script with a subprocess timeout. torch's loader says only
"DataLoader worker (pid ...) exited unexpectedly with exit code 1" in every case here.
Sending the setup that way still starts a worker whose dataset holds multiprocessing shared
memory, and leaves the worker holding its dataset once, not also its pickled bytes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import headrace as hr

pytestmark = pytest.mark.integration

GUARD_HINT = "if __name__ == '__main__':` runs it again"  # start_death_error's guard hint

LOOP = '''
    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return 4
        def __getitem__(self, i):
            return i
    for b in hr.DataLoader(DS(), batch_size=2, num_workers=1,
                           multiprocessing_context="spawn"):
        print(b)
'''


def run_script(args: list[str], cwd: Path) -> str:
    """The line of the training process's error in the stderr of a Python run with ``args``
    that must fail (bounded)."""
    src = str(Path(hr.__file__).parents[1])
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert done.returncode != 0, done.stdout
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("headrace.errors.")]
    assert lines, done.stderr[-3000:]
    return lines[-1]


def test_a_class_in_main_of_python_c_is_named_and_the_guard_is_not_blamed(tmp_path):
    code = "import torch, headrace as hr\n" + textwrap.dedent(LOOP)
    last = run_script(["-c", code], tmp_path)
    assert "WorkerDiedError[AttributeError]" in last, last
    assert "'DS' is defined in __main__ of a program that has no file" in last, last
    assert "Can't get attribute 'DS'" in last and "__name__" not in last, last


def test_a_class_under_the_guard_is_named_and_a_script_without_one_still_hears_of_it(
        tmp_path):
    under = tmp_path / "under_guard.py"
    under.write_text("import torch, headrace as hr\nif __name__ == '__main__':\n"
                     + textwrap.indent(textwrap.dedent(LOOP), "    "))
    last = run_script([str(under)], tmp_path)
    assert f"'DS' is not at the top level of {under}" in last, last
    assert GUARD_HINT not in last, last
    # no guard at all: the worker re-runs the script and dies before it runs any of
    # headrace's code; that is where the guard is the likely cause, and it is still said
    bare = tmp_path / "no_guard.py"
    bare.write_text("import torch, headrace as hr\n" + textwrap.dedent(LOOP))
    last = run_script([str(bare)], tmp_path)
    assert "died 3 times in a row while starting" in last and GUARD_HINT in last, last


class Nowhere(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_class_of_a_module_the_worker_cannot_import_names_the_module(method, monkeypatch):
    # a module made at run time: importable here, not in a new interpreter
    mod = types.ModuleType("headrace_made_at_run_time")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    cls = type("Nowhere", (Nowhere,), {"__module__": mod.__name__})
    mod.Nowhere = cls  # type: ignore[attr-defined]
    loader = hr.DataLoader(cls(), batch_size=2, num_workers=1, multiprocessing_context=method)
    with pytest.raises(ModuleNotFoundError) as got:
        list(loader)
    text = str(got.value)
    assert isinstance(got.value, hr.WorkerDiedError), text
    assert ("module 'headrace_made_at_run_time', where 'Nowhere' is defined, is not found in "
            "the worker") in text and f"A {method!r} worker" in text, text
    assert "No module named 'headrace_made_at_run_time'" in text, text
    assert "__name__" not in text, text


COUNTING = '''
import multiprocessing as mp
import sys

import torch
import headrace as hr


class Counting(torch.utils.data.Dataset):
    """Counts its samples in a multiprocessing Value: shared memory from multiprocessing's
    heap, whose arena (one file descriptor) also holds the loader's own shared arrays."""

    def __init__(self, ctx):
        self.count = ctx.Value("i", 0)

    def __len__(self):
        return 16

    def __getitem__(self, i):
        with self.count.get_lock():
            self.count.value += 1
        return i


if __name__ == "__main__":
    for method in sys.argv[1:]:
        ds = Counting(mp.get_context(method))
        got = [int(i) for b in hr.DataLoader(ds, batch_size=4, num_workers=2,
                                             multiprocessing_context=method) for i in b]
        print(method, sorted(got) == list(range(16)), ds.count.value, flush=True)
'''


def test_a_dataset_holding_a_shared_value_starts_spawned_workers(tmp_path):
    # a fresh interpreter: its first heap arena holds the dataset's Value and the loader's
    # arrays, which the worker's setup and its shared arrays then both sent; spawn refused
    # the fd passed twice (ValueError: bad value(s) in fds_to_keep) and no worker started
    script = tmp_path / "counting.py"
    script.write_text(COUNTING)
    src = str(Path(hr.__file__).parents[1])
    done = subprocess.run([sys.executable, str(script), "spawn", "forkserver"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240,
                          env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n") == ["spawn True 16", "forkserver True 16", ""], done.stdout


def private_bytes() -> int:
    """This process's unique set size (bytes): its private pages, clean and dirty."""
    with open("/proc/self/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return sum(int(fields[k].split()[0]) * 1024 for k in ("Private_Clean", "Private_Dirty"))


class Holding(torch.utils.data.Dataset):
    """Holds ``mib`` MiB of ones (pages written, so resident); each sample is the worker's
    unique set size when it runs (bytes)."""

    def __init__(self, mib: int) -> None:
        self.array = np.ones(mib << 20, dtype=np.uint8)

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> int:
        return private_bytes()


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux's smaps_rollup")
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_spawned_worker_holds_its_dataset_once(method):
    # the same worker with a 1 MiB and a 64 MiB dataset: 64 MiB apart, not twice that (the
    # pickled setup was held for the worker's life: a 200 MiB dataset, USS 550 MiB, not 351)
    def uss(mib: int) -> int:
        loader = hr.DataLoader(Holding(mib), batch_size=1, num_workers=1,
                               multiprocessing_context=method)
        return int(next(iter(loader))[0])

    grown = (uss(64) - uss(1)) / 2**20
    assert 48 < grown < 96, f"{grown:.0f} MiB more for a dataset 63 MiB larger"
