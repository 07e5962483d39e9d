"""This process's LMDB environments (``lmdb_store``'s shards on tmpfs): opened once per process
and path, a write lock each, and LMDB's lock file reserved before LMDB maps it.

An LMDB environment must not be used across ``fork()``, and py-lmdb refuses to open in a child
a file its parent had open at the fork: environments are kept by (pid, path), and a forked
child's locks are new.

Closing while another thread uses it: worker threads (``executor="threads"``) share the
training process's environments, and a thread that a shutdown gave up on (it was inside a
step: nothing stops a thread) goes on to store its sample's form after the loader closed its
cache. py-lmdb's ``Environment.close()`` invalidates the transactions of other threads and
unmaps the file with the GIL released, while a thread inside a commit (the GIL released too) or
decoding an entry read in place still uses it: an ``lmdb.Error`` at best, a crash at worst (a
bug hunt: "the cache failed (Error: Attempt to operate on closed/deleted/dropped object.)",
a cache error counted, in 1 interrupted run of 15). So every operation runs inside
:class:`Use`, which counts the threads in the environment, and a close waits for none: it
marks the environment, and the last thread to leave closes it. A cache closed for good
(``close_envs``: its directory is removed next) answers later operations with
:class:`StoreClosed`, which the client takes for the shutdown it is (not a failure).
"""

from __future__ import annotations

import os
import threading
from typing import Any

PAGE = 4096
"""LMDB's page size here (bytes)."""

GONE_KEPT = 1024
"""Cache directories closed for good that this process remembers (the latest): a thread that
outlived its loader finds its directory removed anyway once ``remove_dir`` has run."""


class StoreClosed(Exception):
    """The store's cache was closed for good in this process (its loader closed): what a
    worker thread that outlived its loader meets, not a failure of the cache."""


class _Open:
    """One environment of this process: its handles, the threads inside it (``users``), and
    whether it is to close once they left (``closing``) for good (``gone``)."""

    __slots__ = ("dbs", "users", "closing", "gone")

    def __init__(self, dbs: tuple[Any, Any, Any]) -> None:
        self.dbs = dbs
        self.users = 0
        self.closing = False
        self.gone = False


_envs: dict[tuple[int, str], _Open] = {}
"""Environments by (pid, path); entries of a parent process are kept, never closed (fork)."""
_gone: dict[str, None] = {}
"""Cache directories closed for good in this process (``close_envs``), the latest
``GONE_KEPT``."""
_envs_lock = threading.Lock()
_pid = os.getpid()
"""This process's id (``os.getpid()`` is a system call, made once per process)."""
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
    global _envs_lock, _pid
    _envs_lock = threading.Lock()
    _pid = os.getpid()
    _write_locks.clear()


os.register_at_fork(after_in_child=_reinit_locks)  # a lock held by a thread at fork time


def close_envs(path: str) -> None:
    """Close this process's environments at ``path`` and below it (a backend's shards) for
    good: a later operation there raises :class:`StoreClosed`. One a thread is inside closes
    when it leaves (module docstring)."""
    root = path.rstrip(os.sep)
    with _envs_lock:
        _gone[root] = None
        while len(_gone) > GONE_KEPT:
            del _gone[next(iter(_gone))]
        keys = [k for k in _envs if k[0] == os.getpid()
                and (k[1] == path or k[1].startswith(root + os.sep))]
        for k in keys:
            _close_or_mark(k, gone=True)


def close_env(path: str) -> None:
    """Close this process's environment at ``path`` (reopened on use): now if no thread is
    inside it, else when the last one leaves."""
    with _envs_lock:
        _close_or_mark((os.getpid(), path), gone=False)


def _close_or_mark(key: tuple[int, str], gone: bool) -> None:
    """Under ``_envs_lock``: close the environment at ``key`` now, or mark it where threads are
    inside it (the last one closes it). Closed under the lock: py-lmdb refuses to open an
    environment another thread is still closing ("already open in this process"), which a
    close after the lock let a thread do. Closed for good, its write lock goes too (no thread
    is inside, and none enters again: ``Use`` raises ``StoreClosed``): one per loader stayed
    for the process's life (a hunt: 300 loaders, 300 locks of dead paths)."""
    e = _envs.get(key)
    if e is None:
        return
    e.gone = e.gone or gone
    if e.users:
        e.closing = True
        return
    del _envs[key]
    e.dbs[0].close()
    if e.gone:
        _write_locks.pop(key[1], None)


def _is_gone(path: str) -> bool:
    """Whether ``path`` is in (or is) a cache directory closed for good in this process."""
    p = path.rstrip(os.sep)
    while True:
        if p in _gone:
            return True
        parent = os.path.dirname(p)
        if parent == p:
            return False
        p = parent


class Use:
    """``with Use(path, map_size, readers) as (env, data_db, meta_db):`` one operation on this
    process's environment at ``path``, opened on first use; a close waits for the threads
    inside (module docstring). Raises :class:`StoreClosed` where the cache was closed for good.
    """

    __slots__ = ("path", "map_size", "readers", "_open")

    def __init__(self, path: str, map_size: int, readers: int) -> None:
        self.path, self.map_size, self.readers = path, map_size, readers

    def __enter__(self) -> tuple[Any, Any, Any]:
        key = (_pid, self.path)
        with _envs_lock:
            e = _envs.get(key)
            if e is None or e.gone:
                if e is not None or _is_gone(self.path):
                    raise StoreClosed(f"the cache at {self.path} was closed")
                e = _envs[key] = _Open(_open(self.path, self.map_size, self.readers))
            e.users += 1
        self._open = e
        return e.dbs

    def __exit__(self, *exc: object) -> None:
        e = self._open
        with _envs_lock:
            e.users -= 1
            if e.closing:
                _close_or_mark((_pid, self.path), e.gone)


def open_env(path: str, map_size: int, readers: int) -> tuple[Any, Any, Any]:
    """This process's (environment, data db, meta db) for ``path``, opened once; no thread is
    counted in it (:class:`Use` for operations that a close must wait for)."""
    key = (os.getpid(), path)
    with _envs_lock:
        e = _envs.get(key)
        if e is None:
            e = _envs[key] = _Open(_open(path, map_size, readers))
        return e.dbs


def _open(path: str, map_size: int, readers: int) -> tuple[Any, Any, Any]:
    import lmdb

    try:  # not makedirs: a cache directory its owner removed stays removed
        os.mkdir(path)
    except FileExistsError:
        pass
    reserve_lock_file(path, readers)
    env = lmdb.open(path, map_size=map_size, max_dbs=2, max_readers=readers, sync=False,
                    metasync=False, readahead=False, meminit=False)
    with write_lock(path):  # open_db writes
        return env, env.open_db(b"data"), env.open_db(b"meta")


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
