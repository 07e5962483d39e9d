"""A step's identity follows the code it calls beyond its own: a helper method of its class.
It fell out of the cache key, and a shared Redis cache served samples of the old code (a bug
hunt)."""

from __future__ import annotations

import headrace as hr
from headrace.cache.tiers import TierLayout
from headrace.pipeline.fingerprint import code_identity


class Src:
    def __len__(self) -> int:
        return 4

    def load(self, i: int) -> int:
        return i


def _namespace(fn) -> bytes:
    """The cache namespace of the last form of a one-step pipeline over ``fn``."""
    return TierLayout.for_pipeline(hr.Pipeline(Src(), [hr.step(fn, name="f")])).tiers[0] \
        .namespace(0, 0)


def _step(source: str, **globals_: object):
    """The function ``step`` that ``source`` defines in a script's namespace holding
    ``globals_``."""
    namespace: dict = {"__name__": "job", **globals_}
    exec(source, namespace)  # noqa: S102 - test code building its own function
    return namespace["step"]


CALLABLE = """
class Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return self._go(x)

    def _go(self, x):
        return x * self.k

    def apply(self, x):
        return self._go(x)

step = Scale(2)
"""


def test_a_callable_class_counts_the_helper_methods_it_calls() -> None:
    edited = CALLABLE.replace("x * self.k", "x + self.k")
    for pick in (lambda s: s, lambda s: s.apply):  # the object, a bound method of it
        same = [code_identity(pick(_step(CALLABLE))), _namespace(pick(_step(CALLABLE)))]
        assert [code_identity(pick(_step(CALLABLE))), _namespace(pick(_step(CALLABLE)))] == same
        assert code_identity(pick(_step(edited))) != same[0]
        assert _namespace(pick(_step(edited))) != same[1]
    # an inherited helper counts too, and so does a helper class the step function uses
    sub = CALLABLE.replace("step = Scale(2)", "class Sub(Scale):\n    pass\n\nstep = Sub(2)")
    assert code_identity(_step(sub)) != code_identity(
        _step(sub.replace("x * self.k", "x + self.k")))
    uses = CALLABLE.replace("step = Scale(2)", "def step(x):\n    return Scale(2)(x)\n")
    assert code_identity(_step(uses)) != code_identity(
        _step(uses.replace("x * self.k", "x + self.k")))


def test_a_torch_module_subclass_counts_its_own_methods_not_torchs() -> None:
    import torch

    source = ("class Net(torch.nn.Module):\n    def forward(self, x):\n        return self._f(x)\n"
              "    def _f(self, x):\n        return x * 2\n\nstep = Net()\n")
    net = _step(source, torch=torch)
    assert code_identity(net) == code_identity(_step(source, torch=torch))
    assert code_identity(net) != code_identity(_step(source.replace("x * 2", "x * 3"),
                                                     torch=torch))
