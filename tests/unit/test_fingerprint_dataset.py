"""A plain dataset's fingerprint counts its class's code, not its class name and length alone.

Every script's ``__main__.DS`` of one length had one fingerprint: a dataset returning 600 KB
samples reused the stored profile of one returning 16 B (warm-up skipped), and a dataset whose
``__getitem__`` was edited kept its profile (a bug hunt)."""

from __future__ import annotations

import types
from typing import Any

from headrace.pipeline import Pipeline, code_digest, source_fingerprint
from headrace.pipeline.source import DatasetSource
from headrace.profiler.store import ProfileKey

SMALL = """
import numpy as np

class DS:
    def __init__(self, root="/data/a"):
        self.root = root

    def __len__(self):
        return 200

    def __getitem__(self, i):
        return self._make(i)

    def _make(self, i):
        return np.zeros(4, dtype=np.float32)
"""

LARGE = SMALL.replace("np.zeros(4,", "np.ones((3, 224, 224),")
"""The same class name and length; a helper method returning 600 KB samples."""


def script(source: str, ns: dict[str, Any] | None = None) -> type:
    """Run ``source`` as a training script does (module ``__main__``), in ``ns`` or a fresh
    namespace: two calls are two scripts; the same ``ns`` twice, one script edited."""
    ns = {"__name__": "__main__"} if ns is None else ns
    exec(compile(source, "<script>", "exec"), ns)
    return ns["DS"]


def key(ds: Any) -> ProfileKey:
    return ProfileKey.for_pipeline(Pipeline.from_dataset(ds), machine="m1")


def test_two_scripts_datasets_of_one_name_and_length_but_other_code_differ():
    small, large = script(SMALL), script(LARGE)
    assert (small.__module__, small.__qualname__) == (large.__module__, large.__qualname__)
    assert key(small()).dataset != key(large()).dataset
    # the cache's namespace (by content) and a state dict's record of the dataset likewise
    for content in (False, True):
        assert source_fingerprint(DatasetSource(small()), content) \
            != source_fingerprint(DatasetSource(large()), content)


def test_one_class_keeps_its_key_whatever_its_state():
    """A class counts by its code: its instances share a profile whatever their state (another
    root directory), and the key is the same at each call."""
    small = script(SMALL)
    assert key(small()) == key(small()) == key(small("/data/b"))
    assert key(small()).dataset != key(script(LARGE)()).dataset


def test_an_edited_method_changes_the_key():
    ns: dict[str, Any] = {"__name__": "__main__"}
    before = key(script(SMALL, ns)())
    assert key(script(SMALL, ns)()) == before  # the script run again, unchanged
    after = key(script(LARGE, ns)())  # its helper edited
    assert after.dataset != before.dataset
    edited = script(SMALL, ns)
    first = key(edited())
    edited.__len__ = lambda self: len(range(200))  # the same length, other code
    assert key(edited()).dataset != first.dataset


class Compose:
    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


class Scale:
    def __init__(self, k: float) -> None:
        self.k = k

    def __call__(self, x: Any) -> Any:
        return x * self.k


def shift(x: Any) -> Any:
    return x + 1


class Opaque:
    """A dataset with a Compose transform that headrace leaves inside it (it defines
    ``__getitems__``): its pipeline has no steps, so only the dataset's key can tell its
    transforms apart."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        return self.transform(float(i))

    def __getitems__(self, idx: list[int]) -> list[Any]:
        return [self[i] for i in idx]


def test_a_compose_transform_counts_by_its_code_not_its_parameters():
    scaled = key(Opaque(Compose([Scale(2.0)])))
    assert Pipeline.from_dataset(Opaque(Compose([Scale(2.0)]))).opaque
    assert key(Opaque(Compose([Scale(2.0), shift]))).dataset != scaled.dataset
    assert key(Opaque(Compose([shift]))).dataset != scaled.dataset
    assert key(Opaque(Compose([Scale(3.0)]))) == scaled  # a parameter: the same code


def test_a_set_literal_keeps_the_key_in_every_process():
    """``i in {1, 9}`` compiles to a frozenset constant whose order of iteration (``repr``)
    string hashing decides, seeded anew in each process: the same dataset had another key in
    every process, and a resume was told its dataset changed. 1 and 9 share a slot of a small
    set: built in the other order, the same set iterates the other way, as in another process."""
    source = "class DS:\n    def __len__(self):\n        return 10\n" \
             "    def __getitem__(self, i):\n        return i in {1, 9}\n"
    one, other = script(source), script(source)
    code = other.__getitem__.__code__
    consts = tuple(frozenset([9, 1]) if type(c) is frozenset else c for c in code.co_consts)
    assert [list(c) for c in consts if type(c) is frozenset] == [[9, 1]]
    assert [list(c) for c in code.co_consts if type(c) is frozenset] == [[1, 9]]
    other.__getitem__ = types.FunctionType(code.replace(co_consts=consts),
                                           other.__getitem__.__globals__, "__getitem__")
    assert other()[9] and not other()[2]  # the same code
    first = key(one())
    code_digest._code_digest.cache_clear()  # equal code objects: its cache would answer
    assert key(other()) == first


def test_a_wrapped_dataset_counts_by_the_code_it_wraps():
    # Subset (what random_split returns) and ConcatDataset are torch's classes: only theirs
    # counted, and two scripts' datasets behind one shared a profile and a cache namespace
    import torch.utils.data as tud

    small, large = script(SMALL), script(LARGE)
    for wrap in (lambda d: tud.Subset(d, range(5)), lambda d: tud.ConcatDataset([d, d])):
        assert key(wrap(small())).dataset != key(wrap(large())).dataset
        for content in (False, True):
            assert source_fingerprint(DatasetSource(wrap(small())), content) \
                != source_fingerprint(DatasetSource(wrap(large())), content)
        assert key(wrap(small())) == key(wrap(small()))
    loop = tud.Subset(small(), range(3))
    loop.dataset = loop  # a wrapper that wraps itself: followed a bounded depth
    assert key(loop) == key(loop)


def test_a_files_source_keeps_its_profile_key_where_its_files_move(tmp_path):
    """A ``Files`` pipeline's profile key took the cache's identity of its file set (root and
    every file's modification time): a job staged to a scratch directory, even by ``cp -p``,
    or one whose file was touched, measured its warm-up again (a bug hunt). The key now counts
    a ``Files`` as a plain dataset (class, length, code); the cache's identity still moves."""
    import os
    import shutil

    from headrace.pipeline import step
    from headrace.pipeline.source import Files

    a = tmp_path / "a"
    a.mkdir()
    for i in range(5):
        (a / f"{i}.bin").write_bytes(bytes([i]) * (i + 1))
    shutil.copytree(a, tmp_path / "scratch")  # copies times too, as cp -p
    os.utime(a / "0.bin", ns=(1, 1))  # touched in place, after the copy
    key = [ProfileKey.for_pipeline(Pipeline(Files(d, "*.bin"), [step(len)]), machine="m")
           for d in (a, tmp_path / "scratch")]
    assert key[0] == key[1]
    cache = {source_fingerprint(Files(d, "*.bin"), content=True) for d in (a, tmp_path / "scratch")}
    assert len(cache) == 2  # the sample cache keeps telling the file sets apart
    fewer = Files(a, "[0-3].bin")
    assert ProfileKey.for_pipeline(Pipeline(fewer, [step(len)]), machine="m") != key[0]
