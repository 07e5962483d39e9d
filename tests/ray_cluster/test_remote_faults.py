"""Remote faults: a Ray node killed mid-epoch, an unreachable cluster, shutdown."""

from __future__ import annotations

import fcntl
import functools
import importlib
import logging
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections import Counter

import psutil
import pytest

import headrace as hr
from headrace.remote.starts import MAX_START_FAILURES
from tests.helpers import ArraySource, LogSaid, gated_jitter, ident_collate, jitter
from tests.ray_cluster.conftest import NODE_CPUS, ROOT, STORE_BYTES, live_headrace_actors
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_ready, wait_until

pytestmark = pytest.mark.ray


def node_running(cluster, pid: int):
    """The CPU node of ``cluster`` whose raylet started process ``pid`` (None: no such node,
    or the process is gone)."""
    try:
        ancestors = {p.pid for p in psutil.Process(pid).parents()}
    except psutil.NoSuchProcess:
        return None
    return next((n for n in cluster.cpu_nodes
                 if n.all_processes["raylet"][0].process.pid in ancestors), None)


def test_node_killed_mid_epoch_loses_no_sample(ray_cluster, no_actor_leaks, tmp_path):
    # Killed while its remote worker idled, a node was noticed only once a task went there,
    # and local workers taking over its samples could end the epoch before Ray reported the
    # death (lost == 0 once in CI). Here samples started after the gate closes wait at it; one
    # more batch is asked for in a thread (room for new samples), the node dies while its
    # remote worker holds one, and the epoch goes on once the loader has counted the loss.
    gate, held = tmp_path / "gate", tmp_path / "held"
    held.mkdir()
    pipe = hr.Pipeline(ArraySource(120), [
        hr.step(functools.partial(gated_jitter, str(gate), str(held)), name="jitter",
                random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, shuffle=True, num_workers=1, options=hr.Options(
        seed=5, remote=hr.Remote(max_workers=2, resources=ON_CPU_NODES)))
    it = iter(loader)
    wait_ready(it, 2)
    seen: Counter[int] = Counter()
    for _ in range(5):  # mid-epoch: some batches delivered
        seen.update(int(i) for i in next(it)["i"])
    ours = {os.getpid()} | {w.process.pid for w in list(it.pool.workers.values())
                            if not w.external and w.process.pid is not None}
    lock = open(gate, "w")  # noqa: SIM115 - released once the loss is counted, or in finally
    fcntl.flock(lock, fcntl.LOCK_EX)
    taken: list[dict] = []
    fetch = functools.partial(next, it)
    one_more = threading.Thread(target=lambda: taken.append(fetch()), daemon=True)
    one_more.start()
    victims: list = []

    def a_remote_worker_holds_a_sample() -> bool:
        pids = [int(f) for f in os.listdir(held) if int(f) not in ours]
        victims.extend(n for n in map(functools.partial(node_running, ray_cluster), pids) if n)
        return bool(victims)

    try:
        wait_until(a_remote_worker_holds_a_sample)
        ray_cluster.remove_node(victims[0], allow_graceful=False)  # SIGKILL raylet and workers
        wait_until(lambda: loader.remote.lost >= 1)  # the held sample is re-run elsewhere
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.unlink(gate)
        one_more.join(60)
        assert not one_more.is_alive() and len(taken) == 1
        seen.update(int(i) for i in taken[0]["i"])
        seen.update(int(i) for b in it for i in b["i"])
        assert seen == Counter(range(120))  # every sample exactly once
        assert loader.remote.lost >= 1
    finally:
        lock.close()
        if victims:
            ray_cluster.cpu_nodes.remove(victims[0])
            ray_cluster.cpu_nodes.append(ray_cluster.add_node(
                num_cpus=NODE_CPUS, resources={"cpu_node": 100}, object_store_memory=STORE_BYTES))
            ray_cluster.wait_for_nodes()
        del it
        loader.close()  # also when an assertion failed: no worker threads left for the next test


def test_del_loader_mid_epoch_leaves_no_actor(ray_cluster, no_actor_leaks):
    pipe = hr.Pipeline(ArraySource(200), [hr.step(jitter, name="jitter", random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, options=hr.Options(
        remote=hr.Remote(max_workers=2, resources=ON_CPU_NODES)))
    it = iter(loader)
    wait_ready(it, 2)
    next(it)
    assert len(live_headrace_actors()) == 2
    del it, loader  # no_actor_leaks checks that the actors are gone


UNREACHABLE = textwrap.dedent("""
    import headrace as hr
    from tests.helpers import ArraySource
    pipe = hr.Pipeline(ArraySource(8), [])
    remote = hr.Remote(address="127.0.0.1:{port}", required={required})
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, options=hr.Options(remote=remote))
    try:
        print("batches", len(list(loader)))
    except hr.RemoteUnavailableError as e:
        print("error", e)
""")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens there once closed


@pytest.mark.parametrize("required", [True, False])
def test_unreachable_cluster(required):
    # a fresh interpreter: this one is connected to the session's cluster already
    port = free_port()
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", UNREACHABLE.format(port=port, required=required)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    if required:
        assert f"error headrace could not join the Ray cluster at address '127.0.0.1:{port}'" \
            in out.stdout, out.stderr
    else:
        assert "batches 2" in out.stdout, out.stderr
        assert f"'127.0.0.1:{port}'" in out.stderr and "local workers only" in out.stderr


def test_ctrl_c_in_the_training_loop_leaves_no_actor(ray_cluster, no_actor_leaks):
    pipe = hr.Pipeline(ArraySource(200), [hr.step(jitter, name="jitter", random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, options=hr.Options(
        remote=hr.Remote(max_workers=2, resources=ON_CPU_NODES)))
    it = iter(loader)
    wait_ready(it, 2)
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(it):
            if i == 3:
                raise KeyboardInterrupt  # what Ctrl-C raises in the training loop
    del it, loader  # the traceback let go: the epoch is finalised, its actors killed


DRIVER_ONLY = textwrap.dedent("""
    import threading
    GO = threading.Event()  # the test's gate (worker threads share this process)

    def step(x):
        GO.wait(60)
        return x
""")


@pytest.fixture
def driver_only(tmp_path, monkeypatch):
    """A module of steps this process imports and the Ray nodes cannot (the most common Ray
    setup mistake): remote workers die unpickling their pipeline, in their constructor."""
    name = f"hr_driver_only_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(DRIVER_ONLY)
    monkeypatch.syspath_prepend(str(tmp_path))  # here only: Ray's workers started before
    mod = importlib.import_module(name)
    yield mod
    mod.GO.set()
    sys.modules.pop(name, None)


def start_warnings(caplog) -> list[str]:
    """The loader's warnings that a remote worker could not start (the first with the cause,
    the last when no more are started)."""
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "could not start" in r.getMessage()]


def given_up_epoch(mod, caplog, required: bool):
    """(loader, its epoch) once the remote workers were given up on: the local samples wait
    at the module's gate until then, and run from then on."""
    caplog.set_level(logging.INFO, logger="headrace")
    pipe = hr.Pipeline(ArraySource(24), [hr.step(mod.step, name="only_here")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(executor="threads", remote=hr.Remote(
                               max_workers=2, resources=ON_CPU_NODES, required=required)))
    with LogSaid(f"{MAX_START_FAILURES} in a row") as log:
        it = iter(loader)
        assert log.said.wait(60), "the remote workers were not given up on"
    mod.GO.set()
    return loader, it


@pytest.mark.timeout(120)
def test_worker_that_cannot_start_is_reported_then_given_up(ray_cluster, no_actor_leaks,
                                                            driver_only, caplog):
    # it used to be replaced every second for ever, each time warned as "lost
    # (ActorDiedError); its samples are re-run" without the ModuleNotFoundError
    loader, it = given_up_epoch(driver_only, caplog, required=False)
    assert sorted(s[0] for b in it for s in b) == list(range(24))
    r = loader.remote
    assert r.remote_samples == 0 and r.lost == 0  # none ever ran: none was lost
    assert MAX_START_FAILURES <= r.starts.total <= MAX_START_FAILURES + 1  # one was starting
    causes = [m for m in start_warnings(caplog) if "ModuleNotFoundError" in m
              and driver_only.__name__ in m]
    assert len(causes) == 2, caplog.text  # the cause once, then giving up with it
    assert "local workers only" in causes[1] and "lost" not in caplog.text
    assert "died (exit code" not in caplog.text  # the scheduler's words for a dead process
    text = loader.explain()
    assert "never started" in text and "could not start: ModuleNotFoundError" in text
    assert "no more are started" in text and "lost" not in text
    del it
    loader.close()


@pytest.mark.timeout(120)
def test_worker_that_cannot_start_fails_a_required_remote(ray_cluster, no_actor_leaks,
                                                          driver_only, caplog):
    loader, it = given_up_epoch(driver_only, caplog, required=True)
    with pytest.raises(hr.RemoteUnavailableError,
                       match=f"ModuleNotFoundError: No module named '{driver_only.__name__}'"):
        list(it)
    del it
    loader.close()
