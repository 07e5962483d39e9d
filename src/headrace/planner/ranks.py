"""A node's worker and memory budget, shared by the data-parallel ranks running on it (pure).

Under ``torchrun`` (or ``accelerate launch``, Lightning's DDP, MPI or SLURM) one training process
per accelerator runs on each node, and each has its own loader. Left alone, each loader of
``num_workers="auto"`` would size itself for the whole node: with 8 ranks, 8 × the cores in
workers and 8 × half the memory. Each rank takes ``1 / local ranks`` of both instead.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping

LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                        "MV2_COMM_WORLD_LOCAL_SIZE")
"""Variables that give the ranks on this node outright, in the order they are read:
``torchrun`` and ``accelerate launch``'s, then Open MPI's, Intel MPI / MPICH's, MVAPICH's."""


def local_world_size(env: Mapping[str, str] | None = None,
                     world_size: Callable[[], int | None] | None = None) -> int:
    """Training processes of this job on this node, else 1.

    In turn: a variable of :data:`LOCAL_SIZE_VARIABLES`; inside a SLURM job step, its tasks on
    this node (``SLURM_STEP_TASKS_PER_NODE`` at ``SLURM_NODEID``; Lightning's SLURM
    environment); and where the ranks meet at a loopback ``MASTER_ADDR`` (Lightning's own
    ``ddp`` and ``ddp_spawn`` launchers, a hand-written ``mp.spawn``, which set no local size),
    every rank is on this node: the world size, ``WORLD_SIZE`` or, where that is not set,
    ``world_size()`` (default: ``torch.distributed``'s, once initialised). A launcher that gives
    none of these leaves each rank the whole node unless the script sets ``LOCAL_WORLD_SIZE``.
    """
    env = os.environ if env is None else env
    for name in LOCAL_SIZE_VARIABLES:
        n = _positive(env.get(name))
        if n is not None:
            return n
    n = _slurm_step_tasks_here(env)
    if n is not None:
        return n
    if _is_loopback(env.get("MASTER_ADDR", "")):
        n = _positive(env.get("WORLD_SIZE"))
        if n is None:
            n = (world_size or _distributed_world_size)()
        if n is not None and n > 0:
            return n
    return 1


def cpu_share(cores: int, local_ranks: int) -> int:
    """Cores one rank may plan its workers for: an equal share of ``cores``, at least 1."""
    return max(1, cores // max(1, local_ranks))


def memory_share(available_bytes: float, local_ranks: int) -> float:
    """Bytes of worker memory one rank may use: an equal share of ``available_bytes``."""
    return available_bytes / max(1, local_ranks)


def worker_memory_budget(available_bytes: float, workers_use: float, local_ranks: int) -> float:
    """Bytes of private memory one rank's workers may hold in all: half of what they could
    have now, the machine's available memory plus what they hold already (``workers_use``,
    bytes), shared among the node's ranks (:func:`memory_share`). Taken at each decision:
    memory another process takes later lowers it, and the workers' own growth does not (what
    they take leaves ``available_bytes`` and enters ``workers_use``)."""
    return memory_share((available_bytes + workers_use) / 2, local_ranks)


def _positive(raw: str | None) -> int | None:
    """``raw`` as a count of at least 1, else None (unset, junk, zero)."""
    try:
        n = int(raw) if raw is not None else 0
    except ValueError:
        return None
    return n if n >= 1 else None


_SLURM_COUNTS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _slurm_step_tasks_here(env: Mapping[str, str]) -> int | None:
    """This node's tasks of the SLURM job step (``srun``) this process runs in:
    ``SLURM_STEP_TASKS_PER_NODE`` (``"2(x3),1"``: 2 on each of the first three nodes, 1 on the
    fourth) at index ``SLURM_NODEID`` (relative to the step's nodes: ``SLURM_STEP_NODEID``
    where set). None outside a step or where either is unreadable. The job's own
    ``SLURM_NTASKS_PER_NODE`` is not read: a batch script running one process sees it too."""
    raw = env.get("SLURM_STEP_TASKS_PER_NODE")
    node = env.get("SLURM_STEP_NODEID", env.get("SLURM_NODEID"))
    if raw is None or node is None:
        return None
    try:
        here = int(node)
    except ValueError:
        return None
    for part in raw.split(","):
        m = _SLURM_COUNTS.match(part.strip())
        if m is None:
            return None
        count, nodes = int(m.group(1)), int(m.group(2) or 1)
        if here < nodes:
            return count if count >= 1 else None
        here -= nodes
    return None


def _is_loopback(addr: str) -> bool:
    """Whether ``addr`` is a loopback address or ``localhost`` (no name is looked up)."""
    addr = addr.strip().strip("[]")
    if addr.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _distributed_world_size() -> int | None:
    """``torch.distributed``'s world size once its default group is initialised, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return None
