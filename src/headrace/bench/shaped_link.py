"""A storage node behind a real bandwidth-limited link: a Ray node in its own network namespace.

``StorageNode`` (a context manager; root only) creates a network namespace, a veth pair into
it with private addresses (``10.231.<k>.0/30``), shapes the egress of the namespace's end with
``tc`` (``tbf``: what the storage node sends is limited to ``rate_mbit``), routes the
namespace to the host (the Ray head listens on the host's interface address, which the
namespace reaches through the veth), and starts a Ray worker node inside it joined to a
running cluster (``ray start --address ... --resources '{"headrace_storage": k}' --block``).

Bytes on the wire are read from the host end's interface counters
(``/sys/class/net/<veth>/statistics/{rx,tx}_bytes``): ``rx`` is what the storage node sent.

Teardown stops exactly the processes running in the namespace (``ip netns pids``: the node
this object started and its Ray workers; ``ray stop`` would stop every Ray process of the
machine), then deletes the veth pair (which removes its qdisc) and the namespace.
Traffic stays between the host and the namespace it created.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

RESOURCE = "headrace_storage"
JOIN_TIMEOUT_S = 90.0
"""Seconds a node inside the namespace may take to join the cluster."""
STOP_TIMEOUT_S = 10.0
"""Seconds its processes get to exit after SIGTERM before SIGKILL."""


class LinkUnavailable(RuntimeError):
    """Network namespaces, veth pairs or ``tc`` cannot be used here (not root, no iproute2)."""


def _run(*cmd: str, ns: str | None = None) -> str:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    res = subprocess.run(full, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise LinkUnavailable(f"`{' '.join(full)}` failed: {res.stderr.strip()}")
    return res.stdout


class StorageNode:
    """A Ray node with ``cpus`` CPUs and as many ``headrace_storage`` units, behind a veth
    link whose storage-to-host direction is limited to ``rate_mbit`` megabits per second.

    ``address``: the cluster's GCS address (``host:port``). ``tag``: distinguishes
    concurrent instances (namespace ``hr-sto-<tag>``, subnet ``10.231.<tag % 250>.0/30``).
    ``object_store_bytes``: the node's object store. ``extra_resources``: more custom
    resources of the node (e.g. one that only a test's workers ask for).
    """

    def __init__(self, address: str, cpus: int, rate_mbit: float, tag: int | None = None,
                 object_store_bytes: int = 100 * 1024 * 1024, env: dict[str, str] | None = None,
                 extra_resources: dict[str, float] | None = None) -> None:
        self.address = address
        self.cpus = cpus
        self.rate_mbit = rate_mbit
        self.tag = os.getpid() % 10_000 if tag is None else tag
        self.ns = f"hr-sto-{self.tag}"
        self.host_if = f"hrs{self.tag}h"
        self.ns_if = f"hrs{self.tag}n"
        net = 10 + self.tag % 240
        self.host_ip = f"10.231.{net}.1"
        self.node_ip = f"10.231.{net}.2"
        self.object_store_bytes = object_store_bytes
        self.env = env
        self.resources = {RESOURCE: float(cpus), **(extra_resources or {})}
        self.node_id: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    # -- set-up --------------------------------------------------------------------------------
    def __enter__(self) -> StorageNode:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise LinkUnavailable("network namespaces need root")
        if shutil.which("ip") is None or shutil.which("tc") is None:
            raise LinkUnavailable("iproute2 (ip, tc) is not installed")
        _run("ip", "netns", "add", self.ns)
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _run("ip", "link", "set", self.ns_if, "netns", self.ns)
        _run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        _run("ip", "addr", "add", f"{self.node_ip}/30", "dev", self.ns_if, ns=self.ns)
        _run("ip", "link", "set", self.ns_if, "up", ns=self.ns)
        _run("ip", "link", "set", "lo", "up", ns=self.ns)
        # the head's address is the host's own: reached through the veth, no forwarding
        _run("ip", "route", "add", "default", "via", self.host_ip, ns=self.ns)
        burst = max(32_000, int(self.rate_mbit * 1e6 / 8 / 100))  # 10 ms of the rate, bytes
        _run("tc", "qdisc", "add", "dev", self.ns_if, "root", "tbf", "rate",
             f"{self.rate_mbit}mbit", "burst", str(burst), "latency", "50ms", ns=self.ns)
        self._start_node()

    def _start_node(self) -> None:
        ray_cli = Path(sys.executable).with_name("ray")
        cmd = ["ip", "netns", "exec", self.ns, str(ray_cli), "start", "--block",
               f"--address={self.address}", f"--node-ip-address={self.node_ip}",
               f"--num-cpus={self.cpus}", f"--resources={json.dumps(self.resources)}",
               f"--object-store-memory={self.object_store_bytes}", "--disable-usage-stats"]
        env = dict(os.environ if self.env is None else self.env)
        self._log = open(os.devnull, "wb")  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=self._log, env=env,
                                      start_new_session=True)
        self.node_id = self._wait_joined()

    def _wait_joined(self) -> str:
        import ray

        tick = threading.Event()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while time.monotonic() < deadline:
            for n in ray.nodes():
                if n.get("Alive") and n.get("NodeManagerAddress") == self.node_ip:
                    return str(n["NodeID"])
            if self._proc is not None and self._proc.poll() is not None:
                raise LinkUnavailable(f"the Ray node in {self.ns} exited "
                                      f"(code {self._proc.returncode})")
            tick.wait(0.2)
        raise LinkUnavailable(f"the Ray node in {self.ns} did not join within "
                              f"{JOIN_TIMEOUT_S:.0f} s")

    # -- measurement ---------------------------------------------------------------------------
    def counters(self) -> tuple[int, int]:
        """(bytes received from the storage node, bytes sent to it) on the host's end."""
        base = Path("/sys/class/net") / self.host_if / "statistics"
        return int((base / "rx_bytes").read_text()), int((base / "tx_bytes").read_text())

    def qdisc(self) -> str:
        """``tc qdisc show`` of the namespace's end: the shaping in force."""
        return _run("tc", "qdisc", "show", "dev", self.ns_if, ns=self.ns)

    # -- teardown ------------------------------------------------------------------------------
    def pids(self) -> list[int]:
        """Processes running in the namespace."""
        try:
            out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True,
                                 text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return []
        return [int(p) for p in out.split()]

    def stop_node(self) -> None:
        """Stop the node (its processes in the namespace: SIGTERM, then SIGKILL)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + STOP_TIMEOUT_S
            tick = threading.Event()
            while self.pids() and time.monotonic() < deadline:
                tick.wait(0.1)
        if self._proc is not None:
            try:
                self._proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=STOP_TIMEOUT_S)
            self._proc = None

    def close(self) -> None:
        """Stop the node, delete the veth pair (and its qdisc) and the namespace."""
        self.stop_node()
        if self._log is not None:
            self._log.close()
            self._log = None
        for cmd in (["ip", "link", "del", self.host_if], ["ip", "netns", "del", self.ns]):
            subprocess.run(cmd, capture_output=True, timeout=30)

    def exists(self) -> bool:
        """The namespace or the host's veth end is still there."""
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                            timeout=10).stdout
        return self.ns in ns.split() or Path("/sys/class/net", self.host_if).exists()
