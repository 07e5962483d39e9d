"""One real local Ray cluster for the whole test session: a head node (the "training host")
and two CPU nodes, each its own raylet with its own CPUs and a custom resource ``cpu_node``
that remote workers ask for, so they run on the CPU nodes only."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STORE_BYTES = 100 * 1024 * 1024
"""Object store per node (Ray's minimum is about 75 MB): the tests move a few MB."""
NODE_CPUS = 2
"""CPUs each CPU node declares (Ray slots, not cores: the machine has 2 cores)."""


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # Ray's worker processes import headrace and the tests' helpers by name.
    paths = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": STORE_BYTES,
            "_system_config": {  # notice a killed node within ~2 s, not 30 s
                "health_check_period_ms": 300,
                "health_check_failure_threshold": 3,
                "health_check_initial_delay_ms": 0,
            },
        },
    )
    nodes = [cluster.add_node(num_cpus=NODE_CPUS, resources={"cpu_node": 100},
                              object_store_memory=STORE_BYTES) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.cpu_nodes = nodes
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


GCS_ANSWER_S = 30.0
"""Longest the actor-table query may take (seconds). Ray's accessor waits for the GCS's reply
with no timeout of its own, in C++ where pytest-timeout's signal cannot interrupt it: one full
``make test`` hung there for good in a teardown (``GlobalStateAccessor::GetAllActorInfo``)."""
_gcs_silent: list[str] = []  # set once the GCS failed to answer: later queries fail at once


def live_headrace_actors() -> list[str]:
    """Actors of headrace's remote worker class that are not dead (per Ray's GCS).

    Raises:
        TimeoutError: the GCS did not answer within ``GCS_ANSWER_S`` (now or earlier in the
            session): the test errors instead of the session hanging.
    """
    import threading

    import ray

    if _gcs_silent:
        raise TimeoutError(_gcs_silent[0])
    box: dict[str, object] = {}

    def ask() -> None:
        try:
            box["table"] = ray._private.state.actors()  # the GCS's table: no dashboard needed
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = e

    asker = threading.Thread(target=ask, name="gcs-actor-table", daemon=True)
    asker.start()
    asker.join(GCS_ANSWER_S)
    if asker.is_alive():
        _gcs_silent.append(f"Ray's GCS did not answer the actor-table query in {GCS_ANSWER_S:.0f} s")
        raise TimeoutError(_gcs_silent[0])
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    table = box["table"]
    assert isinstance(table, dict)
    return [a for a, info in table.items()
            if "RemoteWorker" in info.get("ActorClassName", "") and info.get("State") != "DEAD"]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test (``no_actor_leaks`` reads whether it failed)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _stop_leftovers() -> None:
    """Stop the pools a failed test left open (its traceback keeps its loader alive), so their
    remote workers do not hold the cluster's CPUs and fail the tests after it too."""
    from headrace.runtime import live_pools

    for p in live_pools.pools():
        p.shutdown(grace_s=0.2)
    _wait_actors_gone()


def _wait_actors_gone() -> None:
    # ray.kill is asynchronous: the GCS marks a killed actor DEAD within milliseconds; one
    # still alive after 10 s was not killed
    import threading

    tick, deadline = threading.Event(), time.monotonic() + 10.0
    while live_headrace_actors() and time.monotonic() < deadline:
        tick.wait(0.05)


@pytest.fixture
def no_actor_leaks(ray_cluster, request):
    """Fails the test if a headrace actor or proxy thread is still alive after it. After a test
    that failed, stops what it left instead (its failure is the one to read, not a cascade)."""
    import threading

    yield
    gc.collect()
    call = getattr(request.node, "report_call", None)
    if call is not None and call.failed:
        _stop_leftovers()
        return
    try:
        threads = [t.name for t in threading.enumerate() if t.name.startswith("headrace-worker")]
        assert not threads, f"worker threads left behind: {threads}"
        _wait_actors_gone()
        assert not live_headrace_actors(), "Ray actors left behind"
    finally:
        _stop_leftovers()


STORAGE_CPUS = 2
"""CPUs (and ``headrace_storage`` units) of the session's storage node."""


def add_storage_node(cluster):
    """A node of the session's cluster marked as a storage node (near-storage fetchers)."""
    node = cluster.add_node(num_cpus=STORAGE_CPUS, resources={"headrace_storage": STORAGE_CPUS},
                            object_store_memory=STORE_BYTES)
    cluster.wait_for_nodes()
    return node


@pytest.fixture(scope="session")
def storage_node(ray_cluster):
    """One storage node added to the session's cluster (``ray_cluster.storage_node``; a test
    that kills it puts a new one there)."""
    ray_cluster.storage_node = add_storage_node(ray_cluster)
    return ray_cluster


SHAPED_MBIT = 20
"""Egress rate of the shaped storage node's link (megabits per second)."""
SHAPED_CPUS = 2
SHAPED_RESOURCE = "shaped_link"
"""A resource only the shaped storage node has: its tests' workers ask for it."""


@pytest.fixture(scope="module")
def shaped_storage(ray_cluster):
    """A storage node in its own network namespace, joined to the session's cluster over a
    veth pair shaped with ``tc`` to ``SHAPED_MBIT``; torn down after the module (node
    stopped, veth, qdisc and namespace deleted). Skipped where namespaces cannot be made.
    Module scope: ``Cluster.wait_for_nodes`` (other tests) counts only the nodes that
    ``cluster_utils`` added, so this one must be gone before they run."""
    from headrace.bench.shaped_link import LinkUnavailable, StorageNode

    node = StorageNode(ray_cluster.address, cpus=SHAPED_CPUS, rate_mbit=SHAPED_MBIT,
                       extra_resources={SHAPED_RESOURCE: SHAPED_CPUS})
    try:
        node.start()
    except LinkUnavailable as e:
        node.close()
        pytest.skip(f"no shaped storage link here: {e}")
    try:
        yield node
    finally:
        node.close()
        assert not node.exists(), "namespace or veth left behind"
