"""A step's state counts at any depth, cycles end, what cannot be followed whole is recorded
(and keys no cache form), and a random generator a step holds makes it count as random. State
nested more than 6 levels deep counted by its type only: two jobs whose steps held
``partial(prep, t=Compose([Resize(224)]))`` and ``Resize(256)`` shared a Redis cache's entries
(a bug hunt)."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.cache.tiers import TierLayout
from headrace.pipeline.code_digest import code_identity
from headrace.pipeline.digest_scope import MAX_NESTING, TOTAL_NODES, digest_scope


class Resize:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, x):
        return x


class Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x):
        return x


class Holds:
    def __init__(self, value) -> None:
        self.value = value

    def __call__(self, x):
        return x


class Module(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size


class Node:
    def __init__(self, nxt) -> None:
        self.nxt = nxt


def prep(x, t):
    return t(x)


def _variants(size: int) -> dict:
    return {
        "object holding a Compose": Holds(Compose([Resize(size)])),
        "partial(prep, t=Compose)": functools.partial(prep, t=Compose([Resize(size)])),
        "nested Compose": Compose([Compose([Resize(size)])]),
        "nested Sequential": torch.nn.Sequential(torch.nn.Sequential(Module(size))),
        "four objects deep": Holds(Holds(Holds(Holds(Resize(size))))),
    }


@pytest.mark.parametrize("name", list(_variants(1)))
def test_a_parameter_nested_deep_counts_by_value(name) -> None:
    assert code_identity(_variants(224)[name]) != code_identity(_variants(256)[name])
    assert code_identity(_variants(224)[name]) == code_identity(_variants(224)[name])


def test_weights_of_a_nested_module_count() -> None:
    def model(sign: float) -> torch.nn.Module:
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.nn.ReLU())
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(sign)
        return m

    assert code_identity(Holds(model(1.0))) != code_identity(Holds(model(-1.0)))
    assert code_identity(Holds(model(1.0))) == code_identity(Holds(model(1.0)))


def test_a_cycle_ends_and_counts_by_where_it_leads() -> None:
    def ring(size: int, back: int) -> Holds:
        """Six objects in a chain, the last pointing back ``back`` objects up it."""
        chain = [Holds(None) for _ in range(6)]
        for a, b in zip(chain, chain[1:], strict=False):
            a.value = b
        chain[-1].value = {"size": size, "back": chain[-1 - back]}
        return chain[0]

    assert code_identity(ring(224, 5)) == code_identity(ring(224, 5))
    assert code_identity(ring(224, 5)) != code_identity(ring(256, 5))  # past 6 levels
    assert code_identity(ring(224, 5)) != code_identity(ring(224, 2))
    with digest_scope() as found:
        code_identity(ring(224, 5))
    assert found.cut is None


def test_state_too_deep_or_too_large_to_follow_is_recorded_not_cut_silently() -> None:
    deep = None
    for _ in range(MAX_NESTING):
        deep = Node(deep)
    with digest_scope() as found:
        code_identity(Holds(deep))
    assert found.cut is not None and "nested" in found.cut
    # 21,781 containers, none longer than 64 items (so none sampled): each counts
    many = Holds([[[(i, j, k) for k in range(16)] for j in range(64)] for i in range(20)])
    with digest_scope() as found:
        code_identity(many)
    assert found.cut == f"more than {TOTAL_NODES} objects"


class Src:
    def __len__(self) -> int:
        return 4

    def load(self, i: int) -> int:
        return i


def dec(x):
    return x


def norm(x):
    return x


def _layout(fn) -> TierLayout:
    return TierLayout.for_pipeline(hr.Pipeline(Src(), [hr.step(dec, kind="decode"),
                                                       hr.step(norm), hr.step(fn, name="odd"),
                                                       hr.step(norm, name="norm2")]))


def test_no_form_is_kept_at_or_after_a_step_its_digest_could_not_follow() -> None:
    deep = None
    for _ in range(MAX_NESTING):
        deep = Node(deep)
    lay = _layout(Holds(deep))
    assert {t.name: t.position for t in lay.tiers} == {"encoded": 0, "decoded": 2}
    assert not any(t.seeded for t in lay.tiers)
    assert any("step 'odd' is not keyed" in n for n in lay.notes)
    whole = {t.name: t.position for t in _layout(Holds(Node(None))).tiers}
    assert whole == {"encoded": 0, "decoded": 4}


RNG = np.random.default_rng(0)


def reads_a_module_generator(x):
    return x + RNG.random()


@pytest.mark.parametrize("make", [
    lambda: Holds(np.random.default_rng(0)), lambda: Holds(np.random.RandomState(0)),
    lambda: Holds(random.Random(0)), lambda: Holds(torch.Generator().manual_seed(0)),
    lambda: Holds(Holds(Holds(Holds({"g": [np.random.default_rng(0)]})))),
    lambda: functools.partial(prep, t=Holds(random.Random(0))),
    lambda: reads_a_module_generator,
], ids=["Generator", "RandomState", "Random", "torch", "nested", "partial", "global"])
def test_a_step_holding_a_random_generator_counts_as_random(make) -> None:
    lay = _layout(make())
    # the decoded form ends before it; its output and later ones are exact per epoch only
    assert {t.name: (t.position, t.seeded) for t in lay.tiers} == {
        "encoded": (0, False), "decoded": (2, False), "augmented": (4, True)}
    assert any("step 'odd' holds a random generator" in n for n in lay.notes)


def test_a_generator_counts_by_its_type_not_what_it_drew() -> None:
    # a RandomState's state was hashed (its 624 words): a step drawing from one in the
    # training process had another identity at every epoch and state_dict()
    g = np.random.RandomState(0)
    before = code_identity(Holds(g))
    g.random_sample(10)
    assert code_identity(Holds(g)) == before  # a resume's step identity does not change


def test_a_decorated_step_counts_the_globals_its_wrapped_function_reads() -> None:
    namespace: dict = {"torch": torch, "__name__": "job"}
    exec("@torch.no_grad()\ndef features(x):\n    return enc(x)\n",  # noqa: S102 - test code
         namespace)
    torch.manual_seed(0)
    namespace["enc"] = torch.nn.Sequential(torch.nn.Linear(2, 2))
    before = code_identity(namespace["features"])
    with torch.no_grad():
        namespace["enc"][0].weight.mul_(-1.0)  # another checkpoint
    assert code_identity(namespace["features"]) != before
