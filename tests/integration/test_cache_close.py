"""A memory cache closed while a thread of this process is inside one of its LMDB environments
(``cache/lmdb_envs.py``): the close waits for none, and never pulls the environment from under
the thread.

Each case runs in a process of its own: before, py-lmdb's close invalidated the thread's
transaction and unmapped the file under it, and the process crashed (SIGSEGV, an entry read in
place after the close) or hung (a write transaction's close)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

CASE = textwrap.dedent("""
    import sys, threading
    from headrace.cache import memory_backend
    from headrace.cache.lmdb_envs import StoreClosed

    close, op = sys.argv[1], sys.argv[2]
    NS = b"N" * 16
    b = memory_backend.MemoryBackend(memory_backend.make_dir(), 1 << 20, shards=1)
    b.set_budgets({"decoded": 1 << 20})
    key = NS + bytes(8)
    assert b.put(key, "decoded", b"x" * 5000, [NS]) == "stored"
    inside, go, got = threading.Event(), threading.Event(), []

    def decode(buf):  # the entry read in place, inside its transaction, after the close
        inside.set()
        assert go.wait(60)
        return bytes(buf)

    def run():
        try:
            got.append(b.get(key, decode) if op == "get" else b.take(key, "decoded", decode))
        except BaseException as e:
            got.append(repr(e))

    t = threading.Thread(target=run)
    t.start()
    assert inside.wait(60)
    if close == "for_good":
        memory_backend.remove_dir(b.path)  # a loader's close: its cache removed
    else:
        b.close_here()  # before worker processes fork
    go.set()
    t.join(60)
    assert got == [b"x" * 5000], got
    if close == "for_good":  # what comes after is told the cache closed
        try:
            b.put(NS + b"\\x01" * 8, "decoded", b"y", [NS])
        except StoreClosed:
            print("closed")
    else:  # reopened
        assert b.put(NS + b"\\x01" * 8, "decoded", b"y", [NS]) == "stored"
        assert b.get(NS + b"\\x01" * 8, bytes) == b"y"
        memory_backend.remove_dir(b.path)
        print("reopened")
""")


@pytest.mark.parametrize(("close", "op", "then"), [
    ("for_good", "get", "closed"), ("for_good", "take", "closed"),
    ("before_fork", "get", "reopened"), ("before_fork", "take", "reopened")])
def test_a_close_lets_the_thread_inside_the_cache_finish(close, op, then) -> None:
    # a worker thread that outlived its loader (executor="threads": a shutdown gives up on a
    # thread inside a step) stored or read its sample's form after the loader closed the cache
    run = subprocess.run([sys.executable, "-c", CASE, close, op], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == [then]
