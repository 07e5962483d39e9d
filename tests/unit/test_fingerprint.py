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
from headrace.pipeline.fingerprint import code_identity


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


class Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


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
