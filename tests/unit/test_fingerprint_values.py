"""A value that differs anywhere gets another digest: every item of a container, every byte of
an array, up to the bounds ``value_digest`` documents (past them, a sample). Items past the
64th were not hashed, arrays over 1 MiB were sampled: two jobs sharing a Redis cache, whose
decode step held a 100-entry lookup table differing at entry 90, shared entries, and one was
served the other's samples (a bug hunt)."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

from headrace.pipeline import value_digest
from headrace.pipeline.code_digest import code_identity
from headrace.pipeline.fingerprint import source_fingerprint
from headrace.pipeline.value_digest import state_digest


class Obj:
    def __init__(self, i: int) -> None:
        self.i = i


def _tables() -> dict[str, tuple[object, object]]:
    """Name -> (value, the same value with its 91st item changed)."""
    out: dict[str, tuple[object, object]] = {}
    for name, make in {
        "list": lambda k: [i if i != 90 else k for i in range(100)],
        "tuple": lambda k: tuple(i if i != 90 else k for i in range(100)),
        "dict": lambda k: {i: i if i != 90 else k for i in range(100)},
        "dict-str": lambda k: {f"c{i}": float(i if i != 90 else k) for i in range(100)},
        "set": lambda k: {f"w{i:03d}" + ("x" if i == 90 and k != 90 else "")
                          for i in range(100)},  # sorted, the changed one stays 91st
        "records": lambda k: [(f"img{i}.jpg", i if i != 90 else k) for i in range(100)],
        "objects": lambda k: [Obj(i if i != 90 else k) for i in range(100)],
        "nested": lambda k: [[i if i != 90 else k] for i in range(100)],
        "object-array": lambda k: np.array([f"p{i if i != 90 else k}" for i in range(100)],
                                           dtype=object),
    }.items():
        out[name] = (make(90), make(-1))
    return out


TABLES = _tables()


@pytest.mark.parametrize("name", list(TABLES))
def test_a_container_differing_past_its_64th_item_has_another_digest(name):
    """...and an equal one (other objects; a dict or set built in another order) the same."""
    a, b = TABLES[name]
    assert state_digest(a) != state_digest(b)
    again, _ = _tables()[name]
    assert state_digest(a) == state_digest(again)
    if isinstance(a, (dict, set)):
        reordered = (dict(reversed(list(a.items()))) if isinstance(a, dict)
                     else set(sorted(a, reverse=True)))
        assert state_digest(a) == state_digest(reordered)


class Remap:
    def __init__(self, table):
        self.table = table

    def __call__(self, x):
        return self.table[x]


def remap(x, table):
    return table[x]


def _closure(table):
    def step(x):
        return table[x]
    return step


def _default(table):
    def step(x, table=table):
        return table[x]
    return step


class Source:
    def __init__(self, table):
        self.table = table

    def __len__(self):
        return 100

    def load(self, i):
        return self.table[i]


@pytest.mark.parametrize("holder", [
    Remap, lambda t: functools.partial(remap, table=t), _closure, _default,
    lambda t: Remap(t).__call__,
], ids=["callable-object", "partial", "closure", "default", "bound-method"])
@pytest.mark.parametrize("name", ["list", "dict"])
def test_a_steps_table_differing_at_entry_90_gives_another_identity(holder, name):
    a, b = TABLES[name]
    assert code_identity(holder(a)) != code_identity(holder(b))
    assert code_identity(holder(a)) == code_identity(holder(_tables()[name][0]))


@pytest.mark.parametrize("name", ["list", "dict"])
def test_a_sources_table_differing_at_entry_90_gives_another_cache_identity(name):
    a, b = TABLES[name]
    assert (source_fingerprint(Source(a), content=True)
            != source_fingerprint(Source(b), content=True))


def test_an_array_differing_where_the_old_sample_did_not_look_has_another_digest():
    """1.2 MB: sampled at 65,536 places before, which index 1 was not among."""
    a = np.zeros(300_000, np.float32)
    b = a.copy()
    b[1] = 1
    assert a.nbytes > 1 << 20
    assert state_digest(a) != state_digest(b)
    assert state_digest(torch.from_numpy(a)) != state_digest(torch.from_numpy(b))
    assert state_digest(a.tobytes()) != state_digest(b.tobytes())
    assert state_digest(a) == state_digest(a.copy())


def test_a_non_contiguous_array_is_hashed_whole_in_c_order():
    """4.8 MB, copied ``_CHUNK`` bytes at a time (two chunks); element 600 in C order was not
    among the 65,536 sampled before."""
    a = np.arange(600_000, dtype=np.float64).reshape(600, 1000).T  # not contiguous
    assert state_digest(a) == state_digest(np.ascontiguousarray(a))
    b = a.copy()
    b[1, 0] = -1
    assert state_digest(a) != state_digest(b)


def test_over_the_bound_a_large_array_or_list_counts_by_a_sample(monkeypatch):
    """Past ``_FULL_BYTES`` (``_FULL_SCALARS``) an array (a list) counts by ``_SAMPLED`` evenly
    spaced elements, both ends among them, and its dtype, shape (length)."""
    monkeypatch.setattr(value_digest, "_FULL_BYTES", 1 << 16)
    monkeypatch.setattr(value_digest, "_FULL_SCALARS", 1 << 12, raising=False)
    monkeypatch.setattr(value_digest, "_SAMPLED", 1 << 10)
    big = np.zeros(1 << 16, np.float32)
    for where in (0, big.size - 1):
        changed = big.copy()
        changed[where] = 1
        assert state_digest(changed) != state_digest(big)
    between = big.copy()
    between[1] = 1  # not sampled
    assert state_digest(between) == state_digest(big)
    assert state_digest(big.astype(np.int32)) != state_digest(big)
    assert state_digest(big.reshape(2, -1)) != state_digest(big.reshape(-1, 2))
    items = list(range(1 << 14))
    assert state_digest(items) != state_digest(items + [0])
    assert state_digest(items[:-1] + [-1]) != state_digest(items)


def test_a_large_mapped_array_counts_by_its_file_not_its_bytes(tmp_path, monkeypatch):
    """A memmap over the bound is data a source reads: its path, its place in the file and the
    file's size and time identify it, and none of it is read."""
    monkeypatch.setattr(value_digest, "_FULL_BYTES", 1 << 12)
    paths = [str(tmp_path / f"{k}.npy") for k in "ab"]
    for p in paths:
        np.save(p, np.zeros(1 << 14, np.uint8))
    a, b = (np.load(p, mmap_mode="r") for p in paths)
    assert state_digest(a) != state_digest(b)  # two files, equal bytes
    assert state_digest(a) == state_digest(np.load(paths[0], mmap_mode="r"))
    assert state_digest(a[1:]) != state_digest(a[:-1])  # the view's place
    assert state_digest(np.asarray(a)) == state_digest(a)
    before = state_digest(a)
    st = os.stat(paths[0])
    w = np.load(paths[0], mmap_mode="r+")
    w[5] = 1
    w.flush()
    del w
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns))  # same time: content not read
    assert state_digest(a) == before
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # rewritten: told apart
    assert state_digest(a) != before


class _Counting:
    """``hashlib`` as value_digest uses it, counting the bytes its SHA-256 objects are fed."""

    def __init__(self) -> None:
        import hashlib

        self.fed = 0
        self._sha256 = hashlib.sha256

    def sha256(self, data: bytes = b"") -> object:
        outer = self
        inner = self._sha256(data)
        self.fed += memoryview(data).nbytes

        class Fed:
            def update(self, more: object) -> None:
                outer.fed += memoryview(more).nbytes
                inner.update(more)

            def hexdigest(self) -> str:
                return inner.hexdigest()

        return Fed()


def test_one_digest_hashes_at_most_its_budget_in_full_however_many_arrays_it_holds(monkeypatch):
    # each bound is a container's or an array's: they compounded, and a source holding 9,000
    # decoded 150 KB images hashed all of them at every epoch's start (0.86 s, a review)
    images = [np.full((64, 64, 3), i % 251, np.uint8) for i in range(3000)]  # 36 MB
    counting = _Counting()
    monkeypatch.setattr(value_digest, "hashlib", counting)
    digest = state_digest({"images": images})
    assert counting.fed <= (32 << 20) + (1 << 20)  # TOTAL_BYTES (+ names, samples)
    assert state_digest({"images": images}) == digest  # still a digest of the same value
    monkeypatch.undo()
    changed = list(images)
    changed[0] = images[0] + 1
    assert state_digest({"images": changed}) != digest  # what the budget covers still counts
