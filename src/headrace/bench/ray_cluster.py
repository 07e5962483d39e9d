"""A local multi-node Ray cluster for a benchmark, that a section can get back healthy.

A benchmark made of several sections (``bench/remote.py``) must write what it measured even when
one section breaks Ray: a raylet that aborts on the training host ends every actor of the job
and the driver's connection (docs/benchmarks.md, the remote section), and the sections after it
would fail one after another. :class:`BenchCluster` starts the cluster, says whether it is
still whole (every node it started alive, the driver connected), and starts a fresh one when it
is not. With ``address`` it joins a running cluster instead and never restarts it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import headrace as hr

log = logging.getLogger("headrace")

STORE_BYTES = 200 << 20
"""Object store per node (bytes): the benchmark's samples are inlined in calls or small."""


class BenchCluster:
    """``nodes`` CPU nodes of ``node_cpus`` slots with the custom resource ``cpu_node``, and a
    head node without CPUs for actors (the training host), or the cluster at ``address``."""

    def __init__(self, nodes: int, node_cpus: int, address: str | None = None) -> None:
        self.nodes, self.node_cpus, self.address = nodes, node_cpus, address
        self.cluster: Any = None
        self.restarts = 0
        """Fresh clusters started after the first (each after a section broke one)."""

    def remote_kw(self) -> dict[str, Any]:
        """``Remote(...)`` keywords that put remote workers on the CPU nodes."""
        kw: dict[str, Any] = {"address": self.address or "auto"}
        if self.address is None:
            kw["resources"] = {"cpu_node": 1}
        return kw

    def start(self) -> None:
        import ray

        if self.address is not None:
            ray.init(address=self.address, log_to_driver=False)
            return
        from ray.cluster_utils import Cluster

        # Ray's worker processes import headrace by name
        src = str(Path(hr.__file__).resolve().parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join(
            x for x in (src, os.environ.get("PYTHONPATH", "")) if x)
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "object_store_memory": STORE_BYTES})
        for _ in range(self.nodes):
            self.cluster.add_node(num_cpus=self.node_cpus, resources={"cpu_node": 1000},
                                  object_store_memory=STORE_BYTES)
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, log_to_driver=False)

    def healthy(self) -> bool:
        """Connected, and every node of the cluster alive (a raylet that aborted is not)."""
        import ray

        if not ray.is_initialized():
            return False
        try:
            nodes = ray.nodes()
        except Exception:  # noqa: BLE001 - a broken connection raises several kinds
            return False
        alive = sum(bool(n.get("Alive")) for n in nodes)
        return alive == len(nodes) and (self.cluster is None or alive == self.nodes + 1)

    def ensure(self) -> bool:
        """A whole cluster for the next section: a fresh one when this one broke (True: it
        was restarted). A cluster given by ``address`` is only reconnected."""
        if self.healthy():
            return False
        log.warning("the Ray cluster lost a node or the connection: starting a fresh one")
        self.stop()
        self.start()
        self.restarts += 1
        return True

    def stop(self) -> None:
        import ray

        try:
            ray.shutdown()
        finally:
            if self.cluster is not None:
                try:
                    self.cluster.shutdown()
                except Exception as e:  # noqa: BLE001 - a node already gone raises
                    log.warning("shutting the Ray cluster down: %s", e)
                self.cluster = None
