"""The memory cache's directory on /dev/shm: removed however its owner's process group ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

import headrace as hr
from headrace.cache import memory_backend
from tests.helpers import ArraySource

pytestmark = pytest.mark.integration
ROOT = str(Path(__file__).parents[2])


def _watchers(path: str) -> list[psutil.Process]:
    """The processes whose command line names ``path``: its watcher."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if path in (p.info["cmdline"] or []):
            out.append(p)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("watcher_killed", [False, True])
def test_a_signal_to_the_whole_process_group_leaves_no_cache_directory(watcher_killed, tmp_path,
                                                                       monkeypatch):
    # slurm's scancel, a closed terminal, an OOM kill: every process of the group gets the
    # signal, the workers that remove the directory when the training process dies included;
    # 384 MB of /dev/shm stayed behind each time. With the watcher killed as well (a container
    # kill), the next cache made removes it: its owner's lock is free. A private root: other
    # headrace processes on the machine sweep /dev/shm too
    monkeypatch.setattr(memory_backend, "SHM_ROOT", str(tmp_path))
    script = textwrap.dedent(
        f"""
        import signal, sys
        sys.path.insert(0, {ROOT!r})
        import headrace as hr
        from headrace.cache import memory_backend
        from tests.helpers import ArraySource
        memory_backend.SHM_ROOT = {str(tmp_path)!r}
        loader = hr.DataLoader(hr.Pipeline(ArraySource(64), [lambda x: x + 1]), batch_size=4,
                               num_workers=1,
                               options=hr.Options(cache=hr.Cache(budget_bytes=64 << 20)))
        for epoch in range(2):
            for i, b in enumerate(loader):
                if epoch == 1 and i == 0:  # the cache holds the first epoch's forms
                    print(loader.cache.backend.path, flush=True)
                    signal.pause()  # killed here, its worker running
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        path = proc.stdout.readline().strip()
        assert path.startswith(f"{tmp_path}/headrace-cache-") and os.path.isdir(path)
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 1
        watchers = _watchers(path)
        assert len(watchers) == 1, "no process watches the cache directory"
        assert os.getpgid(watchers[0].pid) != proc.pid  # a group signal does not reach it
        if watcher_killed:
            watchers[0].kill()
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(watchers + workers, timeout=30)
        assert not alive
        if watcher_killed:
            assert os.path.isdir(path)
            memory_backend.remove_dir(memory_backend.make_dir())  # sweeps it
        assert not os.path.exists(path)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_a_closed_cache_leaves_no_watcher(no_leaks):
    loader = hr.DataLoader(hr.Pipeline(ArraySource(16), [lambda x: x + 1]), batch_size=4,
                           num_workers=1,
                           options=hr.Options(cache=hr.Cache(budget_bytes=64 << 20)))
    try:
        list(loader)
        path = loader.cache.backend.path
        watchers = _watchers(path)
        assert len(watchers) == 1
    finally:
        loader.close()
    assert not os.path.exists(path)
    gone, alive = psutil.wait_procs(watchers, timeout=30)
    assert not alive, "the watcher outlived a cache closed normally"
