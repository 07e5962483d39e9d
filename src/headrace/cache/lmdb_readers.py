"""Readers that lag behind an LMDB store's writes (``lmdb_store``: a write that finds no pages).

A page freed while a reader's snapshot is older is not reused until that reader leaves, so LMDB
takes new pages at the end of the file instead, which the pages the entries hold
(``lmdb_store._pages_held``) do not show. Worker threads (``executor="threads"``) read and write
one environment in one process: a reader that lost the GIL inside ``get`` keeps its snapshot
while a writer holding the GIL commits hundreds of transactions (a bug hunt: 4 threads putting,
getting and taking entries of 200-1,500 bytes on an 8 MiB store filled the file with 0.5 MB of
entries, and ``take`` raised ``MDB_MAP_FULL``, 768 times in 5 s). So a write that LMDB finds no
pages for waits until no reader's snapshot predates the last commit (:func:`wait`: it sleeps,
which lets a reader thread waiting for the GIL run and leave; at most ``READERS_WAIT_S``) and
is tried once more. A snapshot still held at the end of a wait is not waited for again (a
stopped process's reader made every such write wait, under the write lock: 225 of 299 takes,
0.25 s each).
"""

from __future__ import annotations

import time
from typing import Any

READERS_WAIT_S = 0.25
"""The longest a write that found no pages waits for readers to leave older snapshots
(seconds): a thread waiting for the GIL leaves within a few switch intervals (5 ms each), a
process's reader as soon as it runs; one still inside then (a stopped process) is not waited
for longer, nor by later writes while it holds that snapshot, and the write answers as when
full."""
READERS_POLL_S = 0.0005
"""How often that wait looks at LMDB's reader table (seconds)."""

_given_up: dict[str, set[tuple[str, str, int]]] = {}
"""Per store path, the readers' snapshots (``_snapshots``) a wait of this process ended with
still held: not waited for again while they stay. Used under ``lmdb_envs.write_lock``."""


def wait(env: Any, path: str) -> tuple[bool, bool]:
    """Clear the read slots of processes gone, then wait (at most ``READERS_WAIT_S``) until
    every reader of the store at ``path`` whose snapshot predates the last commit left (later
    ones see it), so that LMDB may reuse the pages freed before it. Returns (whether a reader
    held such a snapshot or a slot was cleared, whether the wait ended with one still held: it
    is not waited for again, ``_given_up``)."""
    cleared = bool(env.reader_check())
    last = env.info()["last_txnid"]
    deadline = None
    while True:
        held = _snapshots(env)
        given_up = _given_up.pop(path, set()) & held  # those that left are forgotten
        if given_up:
            _given_up[path] = given_up
        lagging = {s for s in held if s[2] < last} - given_up
        if not lagging:
            return cleared or deadline is not None, False
        if deadline is None:
            deadline = time.monotonic() + READERS_WAIT_S
        elif time.monotonic() > deadline:
            _given_up[path] = given_up | lagging
            return True, True
        time.sleep(READERS_POLL_S)  # the GIL too: a reader thread waiting for it leaves


def _snapshots(env: Any) -> set[tuple[str, str, int]]:
    """``(pid, thread, txnid)`` of every reader of ``env``, of any process, inside a
    transaction (``txnid``: the LMDB transaction id of its snapshot). From LMDB's reader table,
    whose lines read ``pid thread txnid`` (``-`` for a slot not in a transaction)."""
    rows = (line.split() for line in env.readers().splitlines()[1:])
    return {(f[0], f[1], int(f[2])) for f in rows if len(f) == 3 and f[2] != "-"}
