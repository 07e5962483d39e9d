"""What this process may use of the machine: cores and memory within its cgroup's limits.

``os.cpu_count()`` and ``psutil.virtual_memory()`` describe the host. In a container (Docker,
Kubernetes, Slurm, systemd) the process's cgroup may allow far less: a 1.5 GB memory limit on a
24 GB host still reads 23 GB available, and the default cache sized from that got the training
process killed by the kernel's OOM killer inside the limit (a compatibility sweep's find).
Every budget headrace derives from the machine (the default cache, the workers' memory budget,
the worker count) reads these functions instead.

Both cgroup versions are read, from the mounts in ``/proc/self/mountinfo`` and the process's
groups in ``/proc/self/cgroup``: v2 (``memory.max``, ``memory.current``, ``cpu.max``, the
tightest limit of the group and its ancestors) and v1 (``memory.stat``'s
``hierarchical_memory_limit``, ``cpu.cfs_quota_us``). Memory the cgroup holds as inactive page
cache counts as available, as the kernel would reclaim it before killing anything. Where no
cgroup file can be read, the host's numbers stand. The parsers are pure (tested on synthetic
files); :func:`available_memory` and :func:`cpu_limit` read the live system.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

UNLIMITED = 1 << 60
"""Limits at or above this (bytes) mean none: cgroup v1 writes ``PAGE_COUNTER_MAX`` pages."""


def parse_mountinfo(text: str) -> list[tuple[str, str, str, set[str]]]:
    """Cgroup mounts of ``/proc/self/mountinfo``: ``(fs type, root, mount point, options)``,
    ``fs type`` ``"cgroup"`` (v1, one or more controllers in the options) or ``"cgroup2"``."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((tail[0], _unescape(fields[3]), _unescape(fields[4]), set(tail[2].split(","))))
    return out


def parse_cgroups(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as ``{controller: path}``; the v2 group under the key ``""``."""
    out = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(","):
            out[controller] = parts[2]
    return out


def group_dirs(mounts: list[tuple[str, str, str, set[str]]], groups: dict[str, str],
               controller: str) -> list[str]:
    """Directories of the process's group for ``controller`` (``""``: cgroup v2), innermost
    first, then each ancestor up to the mount's root: a limit set on any of them applies."""
    for fstype, root, point, opts in mounts:
        if (controller == "") != (fstype == "cgroup2") or controller and controller not in opts:
            continue
        path = groups.get(controller)
        if path is None:
            continue
        if root == "/":
            rel = path
        elif path == root or path.startswith(root + "/"):  # a mount of a subtree
            rel = path[len(root):]
        else:  # a container's view: its mount's root is the group the process is in
            rel = "/"
        parts = [p for p in rel.split("/") if p]
        return [os.path.join(point, *parts[:k]) for k in range(len(parts), -1, -1)]
    return []


def memory_left(read: Callable[[str], str | None], v2: list[str], v1: list[str]) -> int | None:
    """Bytes the cgroup still lets this process's group use (``None``: no limit found).
    ``read(path)``: a file's text, or ``None`` when it cannot be read. The page cache the
    group's usage counts is given back where the kernel can drop it: its file pages, active
    and inactive, less those dirty or under writeback (as the host's ``MemAvailable``
    counts them; ``/dev/shm`` pages are not file pages there). With the inactive ones
    alone, a dataset read every epoch stayed in the active list, and ``num_workers="auto"``'s
    budget, read at each decision, shrank to what the workers held (a review: 3.40 to 1.00
    GiB under an 8 GiB limit, 4.5 GiB of it droppable)."""
    best: int | None = None
    for d in v2:
        limit = _number(read(os.path.join(d, "memory.max")))
        used = _number(read(os.path.join(d, "memory.current")))
        if limit is None or limit >= UNLIMITED or used is None:
            continue
        left = limit - used + _droppable(read(os.path.join(d, "memory.stat")), "")
        best = left if best is None else min(best, left)
    if v1:  # the group's own statistics carry the tightest limit of its ancestors
        stat = read(os.path.join(v1[0], "memory.stat"))
        limit = _stat(stat, "hierarchical_memory_limit") or None
        used = _number(read(os.path.join(v1[0], "memory.usage_in_bytes")))
        if limit is not None and limit < UNLIMITED and used is not None:
            left = limit - used + _droppable(stat, "total_")
            best = left if best is None else min(best, left)
    return None if best is None else max(0, best)


def _droppable(stat: str | None, prefix: str) -> int:
    """Page cache bytes a cgroup's ``memory.stat`` shows the kernel can drop: file pages,
    active and inactive, less dirty and writeback ones (v2 names; v1's have ``total_`` before
    them, and ``dirty``/``writeback`` for the file ones)."""
    files = _stat(stat, prefix + "active_file") + _stat(stat, prefix + "inactive_file")
    busy = (_stat(stat, prefix + ("file_dirty" if not prefix else "dirty"))
            + _stat(stat, prefix + ("file_writeback" if not prefix else "writeback")))
    return max(0, files - busy)


def cpu_quota(read: Callable[[str], str | None], v2: list[str], v1: list[str]) -> float | None:
    """Cores' worth of CPU time the cgroup allows per second (``None``: no quota)."""
    best: float | None = None
    for d in v2:
        text = read(os.path.join(d, "cpu.max"))
        fields = text.split() if text else []
        q = _ratio(fields[0], fields[1]) if len(fields) == 2 else None
        if q is not None:
            best = q if best is None else min(best, q)
    for d in v1:
        q = _ratio(read(os.path.join(d, "cpu.cfs_quota_us")), read(os.path.join(d, "cpu.cfs_period_us")))
        if q is not None:
            best = q if best is None else min(best, q)
    return best


def available_memory() -> int:
    """Bytes this process may still use: the host's available memory (``psutil``), bounded
    by what its memory cgroup allows."""
    import psutil

    host = int(psutil.virtual_memory().available)
    left = memory_left(_read, *_dirs("memory"))
    return host if left is None else min(host, left)


def private_dirty(text: str | None) -> int | None:
    """Bytes of ``Private_Dirty`` in the text of a ``/proc/PID/smaps_rollup`` (pure); None
    without that line."""
    m = re.search(r"^Private_Dirty:\s+(\d+) kB", text or "", re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def private_memory(pid: int | str = "self") -> int | None:
    """Bytes process ``pid`` holds that no other process shares and the kernel cannot drop:
    its ``Private_Dirty`` (its heap, what it allocated, the pages a fork's copy-on-write and a
    Python object's reference counts copied). What one more forked worker adds to the
    machine's memory, where its RSS also counts the pages it shares with the training process
    (arrays never written, libtorch's ~200 MB), which a cgroup charges once. None where
    ``smaps_rollup`` cannot be read (not Linux, or before 4.14): callers use the RSS then."""
    return private_dirty(_read(f"/proc/{pid}/smaps_rollup"))


def cpu_limit() -> float | None:
    """Cores' worth of CPU the process's cgroup allows (``None``: no quota)."""
    return cpu_quota(_read, *_dirs("cpu"))


def available_cpus() -> int:
    """Cores this process may run on: its affinity, bounded by its cgroup's CPU quota
    (rounded up: a quota of 1.5 cores keeps two busy part of the time)."""
    try:
        cores = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        cores = max(1, os.cpu_count() or 1)
    quota = cpu_limit()
    return cores if quota is None else max(1, min(cores, math.ceil(quota - 1e-9)))


def cpu_usage_ns(read: Callable[[str], str | None], v2: list[str], v1: list[str]) -> int | None:
    """CPU time the process's group (its descendants included) has used, in nanoseconds
    (``None``: not readable): v2 ``cpu.stat``'s ``usage_usec``, v1 ``cpuacct.usage``."""
    if v2:
        usec = _stat(read(os.path.join(v2[0], "cpu.stat")), "usage_usec")
        if usec:
            return usec * 1000
    if v1:
        return _number(read(os.path.join(v1[0], "cpuacct.usage")))
    return None


class CpuUse:
    """Share (0..1) of the CPU this process may use that was busy since the last reading.

    Under a cgroup CPU quota (a container's ``--cpus``), the group's own CPU time over the
    quota: on a 64-core node a pod allowed 4 cores reads 6% busy host-wide while its quota is
    spent, and the worker scaler (MinatoLoader's Formula 2) would keep adding workers the quota
    then throttles. Elsewhere, the share of the cores in this process's affinity, read at each
    call (a ``taskset``, a Slurm or Kubernetes cpuset without a quota: 4 of 16 cores saturated
    read 25% host-wide, while the scaler's bounds count those 4), from per-core times since the
    last call (:class:`PinnedCores`); every core where it is unknown.
    """

    def __init__(self) -> None:
        import time

        self._clock = time.monotonic
        self.quota = cpu_limit()
        self._dirs = _dirs("cpuacct") if self.quota is not None else ([], [])
        self._last = self._sample()
        self._cores = PinnedCores() if self.quota is None else None

    def _sample(self) -> tuple[float, int] | None:
        if self.quota is None:
            return None
        used = cpu_usage_ns(_read, *self._dirs)
        return None if used is None else (self._clock(), used)

    def read(self) -> float:
        """The share since the last call (or since this meter was made)."""
        now = self._sample()
        last, self._last = self._last, now
        if self._cores is not None:  # no quota: the cores it may run on
            return self._cores.read()
        if now is None or last is None or self.quota is None:
            import psutil

            return float(psutil.cpu_percent(None)) / 100.0
        return busy_share(now[1] - last[1], now[0] - last[0], self.quota)


class PinnedCores:
    """Share (0..1) of the cores in this process's affinity, read at each call, that was busy
    since the last reading (or since it was made): per-core times (:func:`cores_busy`), the
    affinity's CPUs mapped to their rows (:func:`affinity_rows`); every core where unknown."""

    def __init__(self) -> None:
        self._times = _core_times()

    def read(self) -> float:
        before, self._times = self._times, _core_times()
        try:
            mine: set[int] | None = os.sched_getaffinity(0)
        except AttributeError:  # not Linux
            mine = None
        online = parse_cpu_list(_read("/sys/devices/system/cpu/online"))
        return cores_busy(before, self._times, affinity_rows(online, mine, len(self._times)))


def parse_cpu_list(text: str | None) -> list[int] | None:
    """CPU numbers of a kernel CPU list (``/sys/devices/system/cpu/online``: ``0-3,6,8-9``),
    ascending; None where it cannot be read."""
    if not text or not text.strip():
        return None
    cpus: set[int] = set()
    try:
        for part in text.strip().split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None
    return sorted(cpus)


def affinity_rows(online: list[int] | None, mine: set[int] | None, n: int) -> Sequence[int]:
    """Rows of psutil's per-CPU times (``n`` rows: the online CPUs, ascending, as ``/proc/stat``
    lists them) of the CPUs in this process's affinity ``mine``; every row where either is
    unknown or they disagree. CPU number and row differ where CPUs are offline: row 2 is CPU 3
    when CPU 2 is."""
    if online is None or mine is None or len(online) != n:
        return range(n)
    rows = [i for i, cpu in enumerate(online) if cpu in mine]
    return rows or range(n)


def _core_times() -> list[Any]:
    import psutil

    return list(psutil.cpu_times(percpu=True))


def cores_busy(before: Sequence[Any], after: Sequence[Any], cores: Sequence[int]) -> float:
    """Share (0..1) of ``cores``' time that was busy between two readings of per-core times
    (``psutil.cpu_times(percpu=True)``: seconds per state; busy is all but ``idle`` and
    ``iowait``, and guest time is in ``user`` already, as ``psutil.cpu_percent`` counts them).
    0 when no time passed."""
    busy = total = 0.0
    for c in cores:
        if c >= len(before) or c >= len(after):
            continue
        (all0, idle0), (all1, idle1) = _all_idle(before[c]), _all_idle(after[c])
        total += max(0.0, all1 - all0)
        busy += max(0.0, (all1 - idle1) - (all0 - idle0))
    return min(1.0, busy / total) if total > 0 else 0.0


def _all_idle(t: Any) -> tuple[float, float]:
    """(all seconds, idle seconds) of one core's times."""
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
    return sum(t) - guest, t.idle + getattr(t, "iowait", 0.0)


def busy_share(used_ns: int, wall_s: float, quota: float) -> float:
    """``used_ns`` of CPU time over ``wall_s`` seconds of a ``quota`` cores' allowance (0..1)."""
    if wall_s <= 0 or quota <= 0:
        return 0.0
    return min(1.0, max(0.0, used_ns / 1e9 / (wall_s * quota)))


def _dirs(controller: str) -> tuple[list[str], list[str]]:
    """(v2 directories, v1 directories) of this process's group for ``controller``."""
    mounts = parse_mountinfo(_read("/proc/self/mountinfo") or "")
    groups = parse_cgroups(_read("/proc/self/cgroup") or "")
    return group_dirs(mounts, groups, ""), group_dirs(mounts, groups, controller)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat(text: str | None, key: str) -> int:
    """The value of ``key`` in a ``memory.stat`` file (0: absent)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def _ratio(quota: str | None, period: str | None) -> float | None:
    q, p = _number(quota), _number(period)
    if q is None or p is None or q <= 0 or p <= 0 or q >= UNLIMITED:
        return None
    return q / p


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (``\\040`` for a space) decoded; other
    characters, UTF-8 ones included, as they are."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
