"""Who owns a memory cache's directory on tmpfs, and who removes it when its owner is killed.

A cache directory holds up to the cache's budget of ``/dev/shm`` (a quarter of the machine's
memory by default), and tmpfs gives nothing back by itself. The owning process removes it when
the cache closes; its workers remove it when they see the owner die. A signal to the whole
process group (slurm's scancel or preemption, a closed terminal's SIGHUP, an OOM or container
kill's SIGKILL) kills the workers too, and a bug hunt found 384 MB left for every such kill.
Three things now end such a directory:

- *The owner's lock.* The owner holds an exclusive ``flock`` on ``owner.lock`` in the directory
  for the cache's life (its forked workers share it); the kernel drops it when the last of
  them dies, however they die. Whoever can take the lock knows the owner is gone, whatever pid
  or pid namespace it had: a container restarted with ``/dev/shm`` kept gives its new trainer
  the killed one's pid, and the pid alone kept every leaked directory (384 MB, 767 MB, 1.2 GB
  after three restarts), and a cache of another container sharing ``/dev/shm`` has a pid that
  means nothing here.
- *A watcher.* A tiny process (``python -I -S``: ``make_dir`` takes about 14 ms more) in a
  session of its own, so that no group or terminal signal reaches it, and not the owner's child
  (forked twice: the owner's children are its workers). It blocks on a socket whose other end
  only the owner and its forked workers hold: a byte (``release``, at a clean close) ends it;
  end of file (all of them dead) makes it take the lock, then remove the directory. A socket,
  not a pipe: the byte is sent with ``MSG_NOSIGNAL``, so a watcher killed by someone cannot
  make the owner's clean close die of SIGPIPE where the user's script restored SIGPIPE's
  default. It ignores SIGTERM, SIGHUP and SIGINT, so that a SIGTERM sent to every process of a
  slurm step still finds it there to clean up.
- *The sweep.* ``remove_orphans``, when any cache is made: every directory whose lock is free.

Names are ``headrace-cache-<pid>-<start>-<random>``: ``<start>`` is the owner's start time
(``/proc/<pid>/stat``'s starttime, clock ticks since boot). The lock file is locked before it
is given its name (created as ``.owner.lock``, renamed), so no sweep finds it unlocked in a live
directory. The lock decides where it exists;
the name decides only in the instant between the directory's creation and its lock (the pid and
the start time must both match a live process to keep it). Names of older versions,
``headrace-cache-<pid>-<random>``, are judged by their pid as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass

DIR_PREFIX = "headrace-cache-"
LOCK_NAME = "owner.lock"

_WATCHER = r"""
import fcntl, os, signal, sys
for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
    signal.signal(s, signal.SIG_IGN)
path, stop = sys.argv[1], int(sys.argv[2])
if os.fork():
    os._exit(0)
try:
    said = os.read(stop, 1)
except OSError:
    said = b""
if said:
    os._exit(0)
try:
    fd = os.open(os.path.join(path, "owner.lock"), os.O_RDONLY)
except OSError:
    os._exit(0)
fcntl.flock(fd, fcntl.LOCK_EX)
import shutil
for n in os.listdir(path):
    if n != "owner.lock":
        shutil.rmtree(os.path.join(path, n), ignore_errors=True)
for f in (os.unlink, os.rmdir):
    try:
        f(os.path.join(path, "owner.lock") if f is os.unlink else path)
    except OSError:
        pass
"""
"""The watcher's program (a ``-c`` argument: it imports nothing of headrace). The directory is
removed under the lock, the lock file last, so that a removal cut short leaves a directory the
sweep still judges by its lock."""


@dataclass
class Ownership:
    """What the owning process holds for one cache directory."""

    pid: int
    """The owning process (a process forked from it inherits this and must not close it)."""
    lock_fd: int
    """Open on ``owner.lock``, locked exclusively until the directory is removed."""
    stop: socket.socket | None
    """The owner's end of the watcher's socket (None: no watcher could be started)."""


_owned: dict[str, Ownership] = {}
"""This process's cache directories, by path."""


def start_time(pid: int) -> int | None:
    """When ``pid`` started: clock ticks since boot (``/proc/<pid>/stat``'s field 22), or
    hundredths of a second since the epoch where there is no ``/proc``; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2:].split()[19])  # fields after the name, from 3
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    except (OSError, ValueError, IndexError):
        return None
    import psutil

    try:
        return int(psutil.Process(pid).create_time() * 100)
    except psutil.Error:
        return None


def make_dir(root: str | None) -> str:
    """A fresh directory for this process's cache under ``root`` (None: the temp dir), locked
    and watched; removes dead owners' directories first."""
    import fcntl
    import tempfile

    root = root or tempfile.gettempdir()
    remove_orphans(root)
    pid = os.getpid()
    path = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{pid}-{start_time(pid)}-", dir=root)
    # locked before it has its name: another job's sweep that found an unlocked owner.lock
    # between its creation and its lock would remove this live directory (DDP ranks make
    # their caches at the same moment)
    making = os.path.join(path, f".{LOCK_NAME}")
    fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(making, os.path.join(path, LOCK_NAME))
    _owned[path] = Ownership(pid, fd, _start_watcher(path))
    return path


def _start_watcher(path: str) -> socket.socket | None:
    """Start the watcher of ``path``; the owner's end of its socket, or None where no watcher
    could be started (no Python executable, a sandbox refusing processes): the sweep remains."""
    if not sys.executable:
        return None
    w, r = socket.socketpair()  # both close on exec; forked processes share ``w``
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER, path,
                                 str(r.fileno())],
                                pass_fds=(r.fileno(),), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd="/", start_new_session=True)
        proc.wait()  # the first fork returns at once, leaving the watcher to init
    except (OSError, subprocess.SubprocessError):
        w.close()
        return None
    finally:
        r.close()
    return w


def release(path: str) -> None:
    """After this process removed ``path``: stop its watcher, drop its lock. A no-op in any
    other process (a worker forked from the owner removes the directory but keeps the owner's
    watcher and lock, which are not its own)."""
    own = _owned.get(path)
    if own is None or own.pid != os.getpid():
        return
    del _owned[path]
    if own.stop is not None:
        with contextlib.suppress(OSError):
            own.stop.send(b"q", socket.MSG_NOSIGNAL)
        own.stop.close()
    os.close(own.lock_fd)


def remove_tree(path: str) -> None:
    """Remove ``path``, its lock file last (a removal cut short keeps the lock test usable)."""
    try:
        names = os.listdir(path)
    except OSError:
        return
    for n in names:
        if n != LOCK_NAME:
            shutil.rmtree(os.path.join(path, n), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(path, LOCK_NAME))
    with contextlib.suppress(OSError):
        os.rmdir(path)


def remove_orphans(root: str) -> None:
    """Remove the cache directories under ``root`` whose owners are gone (see the module)."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for n in names:
        if n.startswith(DIR_PREFIX):
            _remove_if_orphaned(os.path.join(root, n), n[len(DIR_PREFIX):].split("-"))


def _remove_if_orphaned(path: str, parts: list[str]) -> None:
    import fcntl

    try:
        fd = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # an older version's, or one being made or removed
        if not _owner_named_alive(parts):
            remove_tree(path)
        return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its owner or one of its workers lives
        os.close(fd)
        return
    try:
        remove_tree(path)
    finally:
        os.close(fd)


def _owner_named_alive(parts: list[str]) -> bool:
    """Whether the owner the name gives lives: ``[pid, start, random]`` (the pid with that
    start time) or, an older version's, ``[pid, random]`` (the pid alone)."""
    if not parts[0].isdigit():
        return True  # not a name of ours: never removed
    pid = int(parts[0])
    if len(parts) == 3 and parts[1].isdigit():
        return start_time(pid) == int(parts[1])
    import psutil

    return bool(psutil.pid_exists(pid))
