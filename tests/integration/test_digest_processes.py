"""Value digests are the same in every process (a forked worker, a spawned one, another run
whose string hashing is seeded otherwise), for the values now hashed in full: a Redis cache
is shared by jobs, and a resume compares the digests a state dict saved in another process."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.integration


def values() -> dict[str, object]:
    """Values over the old bounds, built the same way in every process; ``*-90`` differ from
    their pair at item 90 only."""
    table = list(range(100))
    words = {f"w{i:04d}" for i in range(1000)}  # iterates in a per-process order
    array = np.arange(400_000, dtype=np.float32)  # 1.6 MB: sampled before
    return {
        "list": table, "list-90": table[:90] + [-1] + table[91:],
        "dict": {f"k{i}": i for i in range(100)},
        "dict-90": {f"k{i}": i if i != 90 else -1 for i in range(100)},
        "set": words, "set-90": words - {"w0090"} | {"w0090x"},
        "records": [(f"img{i}.jpg", i % 10) for i in range(100_000)],
        "array": array, "array-90": np.where(np.arange(array.size) == 90, -1, array),
    }


def digests() -> dict[str, str]:
    from headrace.pipeline.value_digest import state_digest

    return {k: state_digest(v) for k, v in values().items()}


def _child(q: mp.Queue) -> None:
    q.put(digests())


def _in(method: str) -> dict[str, str]:
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(q,))
    p.start()
    try:
        return q.get(timeout=120)
    finally:
        p.join(timeout=60)


def test_the_same_value_has_the_same_digest_in_every_process_and_another_value_another(
        no_leaks):
    here = digests()
    for k in ("list", "dict", "set", "array"):
        assert here[k] != here[f"{k}-90"]
    assert _in("fork") == here
    assert _in("spawn") == here
    code = ("import json; from tests.integration.test_digest_processes import digests; "
            "print(json.dumps(digests()))")
    for seed in ("1", "2"):  # another run, its strings hashed (and a set ordered) otherwise
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=120, env=env).stdout
        assert json.loads(out) == here
