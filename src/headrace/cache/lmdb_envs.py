"""This process's LMDB environments (``lmdb_store``'s shards on tmpfs): opened once per process
and path, a write lock each, and LMDB's lock file reserved before LMDB maps it.

An LMDB environment must not be used across ``fork()``, and py-lmdb refuses to open in a child
a file its parent had open at the fork: environments are kept by (pid, path), and a forked
child's locks are new.
"""

from __future__ import annotations

import os
import threading
from typing import Any

PAGE = 4096
"""LMDB's page size here (bytes)."""

_envs: dict[tuple[int, str], tuple[Any, Any, Any]] = {}
"""Environments by (pid, path); entries of a parent process are kept, never closed (fork)."""
_envs_lock = threading.Lock()
_write_locks: dict[str, threading.Lock] = {}
"""One LMDB write transaction at a time per process and environment: py-lmdb waits for LMDB's
writer mutex holding the GIL, so a second thread starting a write in an environment while the
first is in one deadlocks. Writes to different environments (shards) do not wait for each
other."""


def write_lock(path: str) -> threading.Lock:
    """This process's write lock of the environment at ``path``."""
    lock = _write_locks.get(path)
    if lock is None:  # setdefault is atomic: two threads get the same lock
        lock = _write_locks.setdefault(path, threading.Lock())
    return lock


def _reinit_locks() -> None:
    global _envs_lock
    _envs_lock = threading.Lock()
    _write_locks.clear()


os.register_at_fork(after_in_child=_reinit_locks)  # a lock held by a thread at fork time


def close_envs(path: str) -> None:
    """Close this process's environments at ``path`` and below it (a backend's shards)."""
    with _envs_lock:
        keys = [k for k in _envs if k[0] == os.getpid()
                and (k[1] == path or k[1].startswith(path.rstrip(os.sep) + os.sep))]
        envs = [_envs.pop(k) for k in keys]
    for dbs in envs:
        dbs[0].close()


def close_env(path: str) -> None:
    """Close this process's environment at ``path`` (no transaction may be open)."""
    with _envs_lock:
        dbs = _envs.pop((os.getpid(), path), None)
    if dbs is not None:
        dbs[0].close()


def open_env(path: str, map_size: int, readers: int) -> tuple[Any, Any, Any]:
    """This process's (environment, data db, meta db) for ``path``, opened once."""
    import lmdb

    key = (os.getpid(), path)
    with _envs_lock:
        dbs = _envs.get(key)
        if dbs is None:
            reserve_lock_file(path, readers)
            env = lmdb.open(path, map_size=map_size, max_dbs=2,
                            max_readers=readers, sync=False, metasync=False, readahead=False,
                            meminit=False)
            with write_lock(path):  # open_db writes
                dbs = (env, env.open_db(b"data"), env.open_db(b"meta"))
            _envs[key] = dbs
        return dbs


def reserve_lock_file(path: str, readers: int) -> None:
    """Create LMDB's lock file with its pages reserved (``posix_fallocate``), unless it exists.

    LMDB writes its reader table through a shared mapping of ``lock.mdb``; on a full tmpfs a
    write to a page not yet there kills the process with SIGBUS instead of failing (a
    compatibility sweep: a full ``/dev/shm`` ended the training process at an epoch's close,
    with no message). Reserved first, the lack of space is an ``OSError`` here. The size
    covers LMDB's table for ``readers`` (64 bytes a slot plus its header); LMDB keeps a larger
    file as it is.
    """
    lock = os.path.join(path, "lock.mdb")
    if os.path.exists(lock):
        return
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, -(-((readers + 4) * 64 + PAGE) // PAGE) * PAGE)
    except OSError:
        os.close(fd)
        os.unlink(lock)
        raise
    os.close(fd)
