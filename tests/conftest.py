"""Fixtures shared by all tiers: leak checks on processes and shared memory."""

from __future__ import annotations

import os
import threading

import psutil
import pytest

from tests.garbage import Collections


def _shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


_HELPERS = ("resource_tracker", "forkserver", "redis-server")
"""Python's own per-interpreter helper processes (started once by spawn/forkserver, by design),
and the session's Redis server (the ``redis_server`` fixture; a test may restart it)."""


def _children() -> set[int]:
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE or any(h in " ".join(p.cmdline()) for h in _HELPERS):
                continue
        except psutil.NoSuchProcess:
            continue
        out.add(p.pid)
    return out


def pytest_collection_modifyitems(items):
    """The ``heavy_imports`` tests run last (in their own order): they import Lightning, or
    build a torch optimizer (which imports torch._dynamo and sympy), into the test process,
    where nothing unloads them; each adds 100-200k objects to the heap that the
    ``gc.collect()`` of every later leak check walks (about 600 tests check)."""
    items.sort(key=lambda item: item.get_closest_marker("heavy_imports") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Record on the test item whether its call failed (``no_leaks`` reads it)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.headrace_call_failed = rep.failed


_COLLECTIONS = Collections().install()
"""The session's collection tracker (2.5 us a collection), for the leak checks."""


@pytest.fixture
def no_leaks(request):
    """Fails the test if it leaves worker processes, worker threads or /dev/shm segments behind.

    Cleanup is synchronous (join on shutdown), so no waiting is needed: when something is
    left, we collect garbage so that abandoned iterators are finalized, as they would be in a
    user's program, and look again. Collecting only stops what garbage held, it never starts
    anything, so a first look that finds nothing left needs no collection (a full one walks
    torch's heap: about 0.1 s, in some 600 tests). The collection waits for one another thread
    runs meanwhile, finalisers included (``tests/garbage.py``).
    """
    before_children = _children()
    before_shm = _shm_entries()
    yield
    if getattr(request.node, "headrace_call_failed", False):
        return  # pytest's report keeps the failure's traceback, and with it the epoch's
        # iterator and its workers: a second error for the same failure (a CI run's
        # "worker processes left behind" after a failed assertion) would only hide the first
    left = _left_behind(before_children, before_shm)
    if any(left):
        _COLLECTIONS.collect()  # (tests/garbage.py: not gc.collect() alone)
        left = _left_behind(before_children, before_shm)
    children, new_shm, threads = left
    assert not children, f"worker processes left behind: {sorted(children)}"
    assert not new_shm, f"shared-memory segments left behind: {sorted(new_shm)}"
    assert not threads, f"worker threads left behind: {threads}"


def _left_behind(before_children: set[int], before_shm: set[str]
                 ) -> tuple[set[int], set[str], list[str]]:
    """(new child processes, new /dev/shm segments of ours, headrace worker threads)."""
    children = _children() - before_children
    new_shm = {e for e in _shm_entries() - before_shm if _ours_or_orphaned(e)}
    threads = [t.name for t in threading.enumerate() if t.name.startswith("headrace-worker")]
    return children, new_shm, threads


def _ours_or_orphaned(entry: str) -> bool:
    """A torch or headrace segment (``torch_<pid>_...``, ``headrace-<what>-<pid>-...``) made by
    this process or by a process now dead.

    Segments of live processes outside this test (another job on the machine) are not ours.
    """
    parts = entry.split("_")
    if len(parts) >= 2 and parts[0] == "torch" and parts[1].isdigit():
        pid = int(parts[1])
    elif "headrace" in entry:  # headrace-<what>-<pid>-...: another job's are not ours either
        pid = next((int(p) for p in entry.split("-") if p.isdigit()), os.getpid())
    else:
        return False
    return pid == os.getpid() or not psutil.pid_exists(pid)


@pytest.fixture(scope="session")
def redis_server():
    """One real ``redis-server`` for the test session (tests/redis_server.py), stopped after.

    Skips when the Debian package is not installed (``make test`` installs it)."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    from tests.redis_server import RedisServer

    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _private_profile_store(tmp_path, monkeypatch):
    """Each test gets its own profile store: none reads another's profiles or ~/.cache."""
    monkeypatch.setenv("HEADRACE_PROFILE_STORE", str(tmp_path / "profiles.sqlite"))
