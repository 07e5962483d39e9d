"""Callables that differ in what they compute get different identities, and so different cache
namespaces and pipeline fingerprints: the fingerprint keys the shared sample cache and the
profile store, so a collision serves one pipeline another's samples."""

from __future__ import annotations

import functools
import operator
import pathlib

import numpy as np
import torch

import headrace as hr
from headrace.cache.tiers import TierLayout
from headrace.pipeline.code_digest import code_identity
from tests.helpers import Compose


class Src:
    def __len__(self) -> int:
        return 4

    def load(self, i: int) -> int:
        return i


def scale(x, factor):
    return x * factor


def shift(x, by):
    return x + by


def apply(x, fn):
    return fn(x)


def cast(x, dtype):
    return x


class Scaler:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def apply(self, x):
        return x * self.factor


class Resize:
    def __init__(self, size: int) -> None:
        self.size = [size, size]

    def __call__(self, x):
        return x


class SlotScaler:
    __slots__ = ("factor",)

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


def _keys(fn) -> tuple[str, bytes]:
    """The pipeline fingerprint (profile store key) and the cache namespace of the form
    ``fn`` makes, for a one-step pipeline named ``"f"`` whatever ``fn`` is."""
    pipe = hr.Pipeline(Src(), [hr.step(fn, name="f")])
    return pipe.fingerprint(), TierLayout.for_pipeline(pipe).get("decoded").namespace(0, 0)


def _distinct(*fns) -> bool:
    """Each callable has its own identity, pipeline fingerprint and cache namespace."""
    idents = {code_identity(f) for f in fns}
    fps = {_keys(f)[0] for f in fns}
    namespaces = {_keys(f)[1] for f in fns}
    return len(idents) == len(fps) == len(namespaces) == len(fns)


def test_a_partial_is_its_function_and_its_bound_arguments() -> None:
    assert _distinct(functools.partial(scale, factor=2), functools.partial(scale, factor=3),
                     functools.partial(scale, 2), functools.partial(shift, by=2))
    # equal partials built apart (other objects, other addresses) share their keys
    assert _keys(functools.partial(scale, factor=2)) == _keys(functools.partial(scale, factor=2))


def test_nested_partials_count_all_their_levels() -> None:
    def two(factor):
        return functools.partial(apply, fn=functools.partial(scale, factor=factor))

    assert _distinct(two(2), two(3))
    assert _keys(two(2)) == _keys(two(2))
    # a partial of a partial (flattened by functools or not) keeps both levels' arguments
    outer = [functools.partial(functools.partial(scale), factor=f) for f in (2, 3)]
    assert _distinct(*outer)


def test_bound_arguments_without_a_dict_count_by_value() -> None:
    assert _distinct(functools.partial(cast, dtype=torch.float16),
                     functools.partial(cast, dtype=torch.float32),
                     functools.partial(cast, dtype=np.float16),
                     functools.partial(cast, dtype=np.float32),
                     functools.partial(cast, dtype=pathlib.Path("a")),
                     functools.partial(cast, dtype=np.float32(1.0)))


def test_a_bound_method_counts_the_object_it_is_bound_to() -> None:
    assert _distinct(Scaler(2).apply, Scaler(3).apply)
    assert _keys(Scaler(2).apply) == _keys(Scaler(2).apply)


def test_a_callable_object_counts_its_state_without_a_dict() -> None:
    assert _distinct(SlotScaler(2), SlotScaler(3), operator.itemgetter(0),
                     operator.itemgetter(1))
    assert _keys(SlotScaler(2)) == _keys(SlotScaler(2))


def test_built_in_functions_are_told_apart_by_name() -> None:
    assert _distinct(abs, len, torch.neg, torch.abs)
    assert _distinct(functools.partial(torch.neg), functools.partial(torch.abs))


def test_callable_objects_inside_callable_objects_count_their_state() -> None:
    assert _distinct(Compose([Resize(224)]), Compose([Resize(256)]),
                     Compose([Scaler(2).apply]), Compose([Scaler(3).apply]))
    assert _keys(Compose([Resize(224)])) == _keys(Compose([Resize(224)]))


def test_tensors_of_every_kind_have_a_digest_by_value():
    """bfloat16 (no NumPy dtype), sparse, conjugate and meta tensors: a digest, not an error,
    and one that follows the values."""
    from headrace.pipeline.value_digest import state_digest

    bf = torch.ones(3, dtype=torch.bfloat16)
    assert state_digest(bf) != state_digest(2 * bf)
    sparse = torch.eye(3).to_sparse()
    assert state_digest(sparse) != state_digest(2 * sparse)
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    assert state_digest(z.conj()) == state_digest(z.conj().resolve_conj())
    assert state_digest(z.conj()) != state_digest(z)
    assert state_digest(torch.empty(3, device="meta")) != state_digest(torch.empty(4, device="meta"))
    large = torch.zeros(2**19)  # the last element among 2 MB
    changed = large.clone()
    changed[-1] = 1
    assert state_digest(large) != state_digest(changed)


def test_a_bound_method_over_a_large_dataset_keeps_its_fingerprint_cheap(monkeypatch):
    """The object a step's method is bound to counts by value, its large arrays by a sample:
    its fingerprint still changes with the values it samples."""
    from headrace.pipeline import fingerprint as fp
    from headrace.pipeline import value_digest

    monkeypatch.setattr(value_digest, "_FULL_BYTES", 1 << 20)  # 64 MiB: a smaller dataset

    class Data:
        def __init__(self) -> None:
            self.images = np.zeros((128, 64, 64, 3), np.uint8)  # 1.5 MB

        def __len__(self) -> int:
            return 128

        def load(self, i: int) -> np.ndarray:
            return self.images[i]

        def aug(self, x: np.ndarray) -> np.ndarray:
            return x

    d = Data()
    assert d.images.nbytes > value_digest._FULL_BYTES
    pipe = hr.Pipeline(d, [hr.step(d.aug)])
    before = fp.step_digests(pipe)
    d.images[-1, -1, -1, -1] = 9
    assert fp.step_digests(pipe) != before


def test_large_bytes_are_hashed_by_a_sample_too(monkeypatch):
    from headrace.pipeline import value_digest as fp

    monkeypatch.setattr(fp, "_FULL_BYTES", 1 << 20)
    blob = bytes(fp._FULL_BYTES + 1)
    changed = bytearray(blob)
    changed[-1] = 1
    assert fp.state_digest(blob) != fp.state_digest(bytes(changed))
    assert fp.state_digest(blob) == fp.state_digest(bytearray(blob))  # by value, as before
    small = bytes(100)
    assert fp.state_digest(small) != fp.state_digest(bytes(99))


def test_an_object_array_is_hashed_by_its_elements_the_same_in_every_process():
    # its bytes are pointers: a dataset holding np.array(paths, dtype=object) had another
    # fingerprint in every process, so jobs never shared a cache or a profile
    import subprocess
    import sys

    code = ("import numpy as np; from headrace.pipeline.value_digest import state_digest; "
            "print(state_digest(np.array(['a/1.jpg', 'a/2.jpg', 3], dtype=object)))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=60).stdout for _ in range(2)}
    assert len(runs) == 1
    from headrace.pipeline.value_digest import state_digest

    a = np.array(["a/1.jpg", "a/2.jpg"], dtype=object)
    assert state_digest(a) != state_digest(np.array(["b/1.jpg", "a/2.jpg"], dtype=object))


def test_a_sources_transform_parameters_reach_its_cache_namespace_through_a_subset():
    # two jobs over Subset(Folder(Compose([Resize(224)]))) and Resize(256): the 224 lay below
    # the depth hashed, and they shared a cache's namespaces
    class Folder(torch.utils.data.Dataset):
        def __init__(self, transform) -> None:
            self.transform = transform

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> int:
            return i

    def prefixes(size: int) -> tuple:
        ds = torch.utils.data.Subset(Folder(Compose([Resize(size)])), [0, 1, 2, 3])
        return tuple(t.prefix for t in TierLayout.for_pipeline(hr.Pipeline.from_dataset(ds)).tiers)

    assert prefixes(224) != prefixes(256)
    assert prefixes(224) == prefixes(224)


def _defined(source: str, **globals_: object):
    """The function ``decode`` defined by ``source`` in a module namespace holding ``globals_``
    (as an edited script, or the same script run with other settings, defines it)."""
    namespace: dict = {"np": np, "__name__": "job", **globals_}
    exec(source, namespace)  # noqa: S102 - test code building its own function
    return namespace["decode"]


def test_an_edited_step_has_another_identity():
    # the digest read bytecode and constants only: x.mean() -> x.max() (a name), a default
    # argument, and a module global the step reads (a command-line setting) left it unchanged,
    # and a shared Redis cache served the old entries for its 6-hour lifetime
    mean = _defined("def decode(x):\n    return x.mean()\n")
    assert code_identity(mean) != code_identity(_defined("def decode(x):\n    return x.max()\n"))
    assert code_identity(mean) == code_identity(_defined("def decode(x):\n    return x.mean()\n"))
    k2 = _defined("def decode(x, k=2):\n    return x * k\n")
    assert code_identity(k2) != code_identity(_defined("def decode(x, k=3):\n    return x * k\n"))
    lambdas = [(lambda x, k=k: x * k) for k in (2, 3)]
    assert code_identity(lambdas[0]) != code_identity(lambdas[1])
    reads = "def decode(x):\n    return np.resize(x, SIZE)\n"
    assert code_identity(_defined(reads, SIZE=2)) != code_identity(_defined(reads, SIZE=3))
    assert code_identity(_defined(reads, SIZE=2)) == code_identity(_defined(reads, SIZE=2))
    assert (code_identity(functools.partial(_defined(reads, SIZE=2)))
            != code_identity(functools.partial(_defined(reads, SIZE=3))))  # through a partial
    import argparse

    uses = "def decode(x):\n    return np.resize(x, args.size)\n"
    run = argparse.Namespace(size=2, lr=0.1, resume=None)
    other = [argparse.Namespace(size=3, lr=0.1, resume=None),
             argparse.Namespace(size=2, lr=0.5, resume="ckpt.pt")]
    assert code_identity(_defined(uses, args=other[0])) != code_identity(_defined(uses, args=run))
    # what it does not read: jobs of a search, a run and its resume keep one identity
    assert code_identity(_defined(uses, args=other[1])) == code_identity(_defined(uses, args=run))


def test_two_file_roots_with_the_same_names_and_sizes_are_two_sources(tmp_path):
    from headrace.sources import Files

    for root, fill in (("a", b"1"), ("b", b"2")):
        (tmp_path / root).mkdir()
        (tmp_path / root / "x.bin").write_bytes(fill * 8)
    assert Files(tmp_path / "a").fingerprint() != Files(tmp_path / "b").fingerprint()


def test_a_files_fingerprint_stats_the_files_once_per_process(tmp_path, monkeypatch):
    # it stated every file at every state_dict() and every epoch's cache plan: 0.1 s for
    # 20,000 files, seconds for ImageNet's 1.28 million, at every checkpoint (a bug hunt)
    import os

    from headrace.sources import Files

    for i in range(20):
        (tmp_path / f"{i:02d}.bin").write_bytes(bytes([i]) * 8)
    stats = []
    real_stat = os.stat

    def counting_stat(path, *args, **kwargs):
        if str(path).startswith(str(tmp_path)) and str(path).endswith(".bin"):
            stats.append(path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    files = Files(tmp_path, pattern="*.bin")
    loader = hr.DataLoader(hr.Pipeline(files, [hr.step(len)]), batch_size=4, num_workers=0)
    for _ in range(2):  # each epoch plans the cache's keys
        assert sum(len(b) for b in loader) == 20
        loader.state_dict()
        loader.state_dict()
    assert len(stats) == 20  # each file once
    # a new process's Files (a resume, the next job) takes it afresh: it sees a rewrite
    first = files.fingerprint()
    (tmp_path / "00.bin").write_bytes(b"x" * 8)
    os.utime(tmp_path / "00.bin", ns=(0, 10**9))
    assert files.fingerprint() == first  # this job's file set counts as fixed
    assert Files(tmp_path, pattern="*.bin").fingerprint() != first
    files.paths = files.paths[1:]  # another list: taken again
    assert files.fingerprint() != first


def test_a_files_subclass_without_a_hash_still_has_a_fingerprint(tmp_path):
    """The fingerprint kept per Files object needs it hashable; one with an ``__eq__`` of its
    own (so no ``__hash__``) raised TypeError instead."""
    from headrace.sources import Files

    (tmp_path / "a.bin").write_bytes(b"x")

    class Same(Files):
        def __eq__(self, other):
            return isinstance(other, Same) and other.root == self.root

    assert Same(tmp_path).fingerprint() == Files(tmp_path).fingerprint()
