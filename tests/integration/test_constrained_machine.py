"""The loader on machines that give it less than the host has: a container's small or full
``/dev/shm``, a read-only one, a memory cgroup's limit. The cache is optional: it must never
take the job down where torch's loader runs (a compatibility sweep found SIGBUS, an OOM kill
and a construction error). Each case runs in a private mount namespace or a cgroup made here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import headrace as hr
from headrace import resources
from tests.helpers import ArraySource, IndexDataset

pytestmark = pytest.mark.integration
ROOT = str(Path(__file__).parents[2])
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a mount namespace "
                             "or a cgroup; CI runs as root (the machines' default), so it runs there")

SCRIPT = """
import json, os, sys, warnings
sys.path.insert(0, {root!r})
import numpy as np
import headrace as hr

class Source:
    def __len__(self):
        return 64
    def load(self, i):
        return i

def decode(i):
    return np.full(16384, i, dtype=np.float32)  # 64 KB: the form the cache keeps

def shift(x, rng):
    y = x.copy()
    y[1:] += rng.integers(0, 2)  # element 0 keeps the index
    return y

def fill_shm():
    with open("/dev/shm/filler", "wb") as f:
        try:
            while True:
                f.write(b"x" * (1 << 20)); f.flush()
        except OSError:
            pass

case = {case!r}
if case == "full":
    fill_shm()
pipe = hr.Pipeline(source=Source(), steps=[hr.step(decode, kind="decode"),
                                           hr.step(shift, random=True)])
cache = hr.Cache() if case == "default" else hr.Cache(budget_bytes=8 << 20)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    loader = hr.DataLoader(pipe, batch_size=8, shuffle=True, num_workers={workers},
                           options=hr.Options(cache=cache, profile_store=False))
    epochs = [sorted(int(row[0]) for b in loader for row in b)
              for _ in range(2)]
lines = [l for l in loader.explain().splitlines() if l.startswith("cache")]
loader.close()
print(json.dumps({{"epochs": epochs, "cache": lines,
                  "left": sorted(n for n in os.listdir("/dev/shm") if n != "filler")}}))
"""


def _in_namespace(tmp_path, shm: str, case: str, workers: int = 2) -> dict:
    """Run SCRIPT with a fresh tmpfs of options ``shm`` on /dev/shm, seen by it alone."""
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(root=ROOT, case=case, workers=workers))
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f"mount -t tmpfs -o {shm} tmpfs /dev/shm && exec {sys.executable} {script}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, (out.returncode, out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _exactly_once(epochs: list[list[int]]) -> None:
    assert epochs == [list(range(64))] * 2, epochs


@pytest.mark.root
@as_root
@pytest.mark.parametrize("shm, case, workers, off", [
    # Docker's default: the cache held 31 MB of it and a torch loader beside it ran out
    ("size=64m", "default", 2, "the default budget would be"),
    # LMDB wrote its reader table through a mapping of a file on the full tmpfs: SIGBUS, the
    # training process gone without a word; now the cache fails, with a warning
    ("size=64m", "full", 2, "it failed"),
    # as on AWS Lambda: torch's loader runs at num_workers=0; headrace's raised at
    # construction (its cache counters live in /dev/shm)
    ("size=1m,ro", "explicit", 0, "it could not be set up"),
], ids=["dockers-64-mb", "full", "read-only"])
def test_the_cache_steps_aside_where_dev_shm_cannot_hold_it(tmp_path, shm, case, workers, off):
    got = _in_namespace(tmp_path, shm, case, workers)
    _exactly_once(got["epochs"])
    assert got["cache"][0].startswith(f"cache: off: {off}"), got["cache"]
    assert got["left"] == []
    if case == "default":
        assert "50% of /dev/shm" in got["cache"][0]
    if case == "full":
        assert "No space left on device" in got["cache"][0]


def test_a_dataset_sets_up_no_cache_it_could_not_use(no_leaks):
    loader = hr.DataLoader(IndexDataset(8), batch_size=4, num_workers=0)
    assert loader.cache is None
    assert "cache: off: a Dataset (not a Pipeline)" in loader.explain()
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    shared = hr.DataLoader(IndexDataset(8), batch_size=4,
                           options=hr.Options(cache=hr.Cache(shared_augmented=True)))
    assert shared.cache is not None  # asked for: its output is reused across epochs
    shared.close()


BUDGET_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from headrace import resources
from headrace.cache.config import default_budget
import time
meter = resources.CpuUse()
end = time.monotonic() + 0.3
while time.monotonic() < end:  # one core's worth: the whole quota
    pass
print(resources.available_memory(), default_budget()[0], resources.available_cpus(),
      meter.quota, meter.read())
"""


def _child_groups(name: str) -> tuple[str, str, bool]:
    """(memory group, cpu group, cgroup v1?): new children of this process's groups (v1), or
    one child of the v2 hierarchy's root, where controllers may be enabled for children."""
    v2, v1_mem = resources._dirs("memory")
    v1_cpu = resources._dirs("cpu")[1]
    if v1_mem and v1_cpu and os.path.isdir(v1_mem[0]) and os.path.isdir(v1_cpu[0]):
        mem, cpu = os.path.join(v1_mem[0], name), os.path.join(v1_cpu[0], name)
        os.mkdir(mem)
        try:
            os.mkdir(cpu)
        except OSError:
            os.rmdir(mem)
            raise
        return mem, cpu, True
    assert v2, "neither a cgroup-v1 memory and cpu hierarchy nor a cgroup-v2 one is mounted"
    root = v2[-1]
    Path(root, "cgroup.subtree_control").write_text("+memory +cpu")
    path = os.path.join(root, name)
    os.mkdir(path)
    return path, path, False


@pytest.mark.root
@as_root
def test_a_memory_cgroup_limit_bounds_the_default_cache_and_a_quota_the_cores(tmp_path):
    """psutil reads the host: in a 2 GB cgroup of a 24 GB machine the default cache took 25%
    of the host's memory, and the kernel killed the training process inside the limit."""
    mem, cpu, v1 = _child_groups(f"headrace-test-{os.getpid()}")
    try:
        if v1:
            Path(mem, "memory.limit_in_bytes").write_text(str(2 << 30))
            Path(cpu, "cpu.cfs_period_us").write_text("100000")
            Path(cpu, "cpu.cfs_quota_us").write_text("100000")  # one core's worth
        else:
            Path(mem, "memory.max").write_text(str(2 << 30))
            Path(cpu, "cpu.max").write_text("100000 100000")
        script = tmp_path / "budget.py"
        script.write_text(BUDGET_SCRIPT.format(root=ROOT))
        join = (f"echo $$ > {mem}/cgroup.procs && echo $$ > {cpu}/cgroup.procs && "
                f"exec {sys.executable} {script}")  # (v2: the same group twice)
        out = subprocess.run(["sh", "-c", join], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        fields = out.stdout.split()
        available, budget, cores = map(int, fields[:3])
        quota, busy = map(float, fields[3:])
    finally:
        for p in {mem, cpu}:
            os.rmdir(p)
    assert 0 < available <= 2 << 30
    # 25% of the group's limit at most (the host's 24 GB gave 6 GB); not of `available`, which
    # the group's own use moves between the two reads (CI: 1 KB apart, the budget 1 KB over)
    assert 0 < budget <= (2 << 30) // 4
    assert cores == 1 and quota == 1.0
    assert 0.6 < busy <= 1.0  # the group's time over its quota (on the host's 2 cores: half)


def _pipeline_loader(**options):
    pipe = hr.Pipeline(source=ArraySource(16), steps=[hr.step(lambda x: x + 1, name="inc")])
    return hr.DataLoader(pipe, batch_size=4, num_workers=0,
                         options=hr.Options(cache=None, **options))


def test_a_locked_profile_store_is_given_up_after_one_wait(tmp_path, caplog, no_leaks):
    """A lock held elsewhere (a stuck job, a network file system): each read and save of the
    profile waited 30 s in the training loop, epoch after epoch, warning each time."""
    import sqlite3

    path = tmp_path / "profiles.sqlite"
    first = _pipeline_loader(profile_store=str(path))  # a store with this job's profile
    list(first)
    first.close()
    assert path.exists()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # held until the end of the test
    try:
        loader = _pipeline_loader(profile_store=str(path))
        with caplog.at_level("WARNING", logger="headrace"):
            for _ in range(3):
                assert sorted(int(x) for b in loader for x in b.flatten()) == list(range(1, 17))
            loader.close()
        warned = [r for r in caplog.records if "profile" in r.getMessage()]
        assert len(warned) == 1 and "database is locked" in warned[0].getMessage()
        assert "not kept: could not read profiles from" in loader.explain()
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_no_profile_store_is_made_in_a_home_that_does_not_exist(tmp_path, monkeypatch,
                                                                 no_leaks):
    home = tmp_path / "nonexistent"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HEADRACE_PROFILE_STORE", raising=False)
    loader = _pipeline_loader()
    assert sorted(int(x) for b in loader for x in b.flatten()) == list(range(1, 17))
    loader.close()
    assert not home.exists()
    assert f"the home directory {home} does not exist" in loader.explain()


PINNED_SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
os.sched_setaffinity(0, {{0}})
from headrace import resources
meter = resources.PinnedCores()  # what CpuUse reads where no cgroup quota is set
end = time.monotonic() + 0.3
while time.monotonic() < end:  # core 0, the only one it may use, kept busy
    pass
print(meter.read())
"""


def test_a_process_pinned_to_one_core_reads_that_cores_share():
    """A taskset or cpuset without a quota: the meter reads the cores the process may use,
    not the host (the other cores may idle: host-wide, on 2 cores, about half). It reads the
    per-core meter CpuUse uses without a quota, so it runs under a quota too."""
    root = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", PINNED_SCRIPT.format(root=root)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) > 0.9, out.stdout
