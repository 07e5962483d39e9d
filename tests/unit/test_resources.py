"""What the process may use within its cgroup (``headrace.resources``), on synthetic files."""

from __future__ import annotations

import os

from headrace import resources as r

V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_CGROUP = "4:memory:/job/step\n2:cpu,cpuacct:/job\n0::/\n"


def files(d: dict[str, str]):
    return lambda path: d.get(path)


def test_cgroup_v1_paths_limit_and_quota():
    mounts, groups = r.parse_mountinfo(V1_MOUNTINFO), r.parse_cgroups(V1_CGROUP)
    mem = r.group_dirs(mounts, groups, "memory")
    assert mem == ["/sys/fs/cgroup/memory/job/step", "/sys/fs/cgroup/memory/job",
                   "/sys/fs/cgroup/memory"]
    cpu = r.group_dirs(mounts, groups, "cpu")
    assert cpu == ["/sys/fs/cgroup/cpu,cpuacct/job", "/sys/fs/cgroup/cpu,cpuacct"]
    read = files({
        # the group's own statistics carry its ancestors' tightest limit (1.5 GB here)
        "/sys/fs/cgroup/memory/job/step/memory.stat":
            "cache 10\nhierarchical_memory_limit 1500000000\ntotal_inactive_file 100000000\n",
        "/sys/fs/cgroup/memory/job/step/memory.usage_in_bytes": "600000000\n",
        "/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_quota_us": "150000\n",
        "/sys/fs/cgroup/cpu,cpuacct/job/cpu.cfs_period_us": "100000\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    v2 = r.group_dirs(mounts, groups, "")
    assert r.memory_left(read, v2, mem) == 1_500_000_000 - 600_000_000 + 100_000_000
    assert r.cpu_quota(read, v2, cpu) == 1.5


def test_cgroup_v1_without_a_limit():
    read = files({"/m/memory.stat": f"hierarchical_memory_limit {2**63 - 4096}\n",
                  "/m/memory.usage_in_bytes": "5\n", "/c/cpu.cfs_quota_us": "-1\n",
                  "/c/cpu.cfs_period_us": "100000\n"})
    assert r.memory_left(read, [], ["/m"]) is None
    assert r.cpu_quota(read, [], ["/c"]) is None


def test_cgroup_v2_takes_the_tightest_ancestor():
    mounts = r.parse_mountinfo("30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n")
    groups = r.parse_cgroups("0::/user.slice/job\n")
    dirs = r.group_dirs(mounts, groups, "")
    assert dirs == ["/sys/fs/cgroup/user.slice/job", "/sys/fs/cgroup/user.slice",
                    "/sys/fs/cgroup"]
    read = files({
        "/sys/fs/cgroup/user.slice/job/memory.max": "max\n",
        "/sys/fs/cgroup/user.slice/job/memory.current": "100\n",
        "/sys/fs/cgroup/user.slice/memory.max": "4000000000\n",
        "/sys/fs/cgroup/user.slice/memory.current": "3000000000\n",
        "/sys/fs/cgroup/user.slice/memory.stat": "anon 1\ninactive_file 500000000\n",
        "/sys/fs/cgroup/user.slice/job/cpu.max": "200000 100000\n",
        "/sys/fs/cgroup/user.slice/cpu.max": "max 100000\n",
    })
    assert r.memory_left(read, dirs, []) == 4_000_000_000 - 3_000_000_000 + 500_000_000
    # a dataset read every epoch sits in the active list: droppable too, less what is dirty
    cached = files({"/g/memory.max": "8000000000\n", "/g/memory.current": "7000000000\n",
                    "/g/memory.stat": "anon 2500000000\nactive_file 4000000000\n"
                                      "inactive_file 500000000\nfile_dirty 100000000\n"
                                      "file_writeback 0\n"})
    assert r.memory_left(cached, ["/g"], []) == 1_000_000_000 + 4_400_000_000
    v1 = files({"/m/memory.stat": "hierarchical_memory_limit 8000000000\n"
                                  "total_active_file 4000000000\ntotal_inactive_file 0\n"
                                  "total_dirty 500000000\ntotal_writeback 0\n",
                "/m/memory.usage_in_bytes": "7000000000\n"})
    assert r.memory_left(v1, [], ["/m"]) == 1_000_000_000 + 3_500_000_000
    assert r.cpu_quota(read, dirs, []) == 2.0
    # over its limit (usage may exceed memory.max briefly): nothing left, never negative
    over = files({"/g/memory.max": "100\n", "/g/memory.current": "150\n"})
    assert r.memory_left(over, ["/g"], []) == 0


def test_a_containers_mount_root_is_its_own_group():
    # Docker without a cgroup namespace: the mount's root is the container's group, and
    # /proc/self/cgroup names it in full (or names a group outside the mount)
    mounts = r.parse_mountinfo(
        "40 30 0:33 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n")
    assert r.group_dirs(mounts, {"memory": "/docker/abc"}, "memory") == ["/sys/fs/cgroup/memory"]
    assert r.group_dirs(mounts, {"memory": "/docker/abc/x"}, "memory") == [
        "/sys/fs/cgroup/memory/x", "/sys/fs/cgroup/memory"]
    assert r.group_dirs(mounts, {"memory": "/other"}, "memory") == ["/sys/fs/cgroup/memory"]
    assert r.group_dirs(mounts, {}, "memory") == []  # no such controller: no limit read


def test_escaped_mount_points_and_unreadable_files():
    mounts = r.parse_mountinfo("1 0 0:1 / /mnt/a\\040b rw - cgroup2 cgroup2 rw\n")
    assert mounts[0][2] == "/mnt/a b"
    accented = r.parse_mountinfo("1 0 0:1 / /mnt/caf\u00e9\\011x rw - cgroup2 cgroup2 rw\n")
    assert accented[0][2] == "/mnt/caf\u00e9\tx"  # UTF-8 kept, the octal escape decoded
    assert r.memory_left(files({}), ["/x"], ["/y"]) is None
    assert r.cpu_quota(files({"/x/cpu.max": "garbage"}), ["/x"], []) is None


def test_the_live_numbers_are_within_the_hosts():
    import psutil

    assert 0 < r.available_memory() <= psutil.virtual_memory().total
    assert 1 <= r.available_cpus() <= (os.cpu_count() or 1)


def test_cpu_time_of_the_group_and_its_share_of_the_quota():
    read = files({"/v2/cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n",
                  "/v1/cpuacct.usage": "7000000000\n"})
    assert r.cpu_usage_ns(read, ["/v2"], ["/v1"]) == 2_500_000_000  # v2 first
    assert r.cpu_usage_ns(read, [], ["/v1"]) == 7_000_000_000
    assert r.cpu_usage_ns(files({}), ["/x"], []) is None
    # a pod allowed 4 cores that used 3.6 CPU-seconds in one second: 90% busy, whatever the
    # 64-core host reads
    assert r.busy_share(3_600_000_000, 1.0, 4.0) == 0.9
    assert r.busy_share(9_000_000_000, 1.0, 4.0) == 1.0 and r.busy_share(5, 0.0, 4.0) == 0.0


def test_a_pinned_process_reads_the_share_of_its_own_cores():
    """4 of 16 cores saturated (a taskset, a cpuset without a quota) read 25% host-wide, while
    the scaler's bounds count those 4: it kept adding workers the cores could not run."""
    from collections import namedtuple

    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")

    def core(busy, idle, guest=0.0):
        return T(busy, 0.0, 0.0, idle, 0.0, 0.0, 0.0, 0.0, guest, 0.0)

    before = [core(10.0, 10.0) for _ in range(16)]
    after = [core(11.0, 10.0) if c < 4 else core(10.0, 11.0) for c in range(16)]
    assert r.cores_busy(before, after, [0, 1, 2, 3]) == 1.0
    assert r.cores_busy(before, after, range(16)) == 0.25  # what the host's share said
    assert r.cores_busy(before, after, [3, 4]) == 0.5
    # guest time is counted in user already; iowait is idle; no time passed: 0
    g0, g1 = core(10.0, 10.0, guest=5.0), core(11.0, 10.0, guest=6.0)
    assert r.cores_busy([g0], [g1], [0]) == 1.0
    # CPU 2 offline: /proc/stat lists 0, 1, 3 (rows 0-2); a process pinned to CPU 3 reads row 2
    assert r.parse_cpu_list("0-1,3\n") == [0, 1, 3] and r.parse_cpu_list("0-15") == list(range(16))
    assert r.parse_cpu_list("") is None and r.parse_cpu_list("x") is None
    assert r.affinity_rows([0, 1, 3], {3}, 3) == [2]
    assert list(r.affinity_rows(None, {3}, 3)) == [0, 1, 2]  # unknown: every row
    assert list(r.affinity_rows([0, 1, 3], {0, 1, 2, 3}, 4)) == [0, 1, 2, 3]  # disagree
    io0 = T(1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    io1 = T(1.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert r.cores_busy([io0], [io1], [0]) == 0.0 and r.cores_busy([io0], [io0], [0]) == 0.0


def test_without_a_quota_the_meter_reads_the_hosts_share():
    meter = r.CpuUse()
    if meter.quota is None:
        assert meter._last is None
    assert 0.0 <= meter.read() <= 1.0


def test_private_dirty_is_read_from_smaps_rollup_text():
    text = ("Rss:                1772 kB\nShared_Clean:       1624 kB\nPrivate_Clean:        40 kB\n"
            "Private_Dirty:       108 kB\nAnonymous:           108 kB\n")
    assert r.private_dirty(text) == 108 * 1024
    assert r.private_dirty("Rss: 1 kB\n") is None and r.private_dirty(None) is None

