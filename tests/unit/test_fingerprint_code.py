"""A step's identity follows the code it calls beyond its own: a module it calls into (by the
module's source), a helper method of its class. Each fell out of the cache key, and a shared
Redis cache served samples of the old code (a bug hunt)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

import headrace as hr
from headrace.cache.tiers import TierLayout
from headrace.pipeline.code_digest import code_identity

LIB = "def decode(b):\n    return _scale(b) + 0\n\ndef _scale(b):\n    return b * 2\n"
EDITED = LIB.replace("b * 2", "b * 3")  # the same size: a file's size does not tell them apart


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


@pytest.fixture
def lib(tmp_path, monkeypatch):
    """``(module, path)``: a module ``hr_fp_lib`` written to ``tmp_path`` from ``LIB`` and
    imported; no bytecode cache (a rewrite of the same size within a second would load the
    old ``.pyc``)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "hr_fp_lib.py"
    path.write_text(LIB)
    monkeypatch.delitem(sys.modules, "hr_fp_lib", raising=False)
    yield importlib.import_module("hr_fp_lib"), path
    sys.modules.pop("hr_fp_lib", None)


def test_a_module_a_step_calls_into_counts_by_its_source(lib) -> None:
    mod, path = lib
    through_module = _step("def step(b):\n    return hr_fp_lib.decode(b)\n", hr_fp_lib=mod)
    imported = _step("def step(b):\n    return decode(b)\n", decode=mod.decode)  # from .. import
    before = [code_identity(through_module), code_identity(imported), _namespace(imported)]
    path.write_text(EDITED)
    # not reloaded: this process still runs the code it imported, and keeps its keys
    assert [code_identity(through_module), code_identity(imported),
            _namespace(imported)] == before
    importlib.reload(mod)
    after = [code_identity(through_module), code_identity(imported), _namespace(imported)]
    assert all(a != b for a, b in zip(after, before, strict=True))
    path.write_text(LIB)
    importlib.reload(mod)  # the same source again: the same keys
    assert [code_identity(through_module), code_identity(imported),
            _namespace(imported)] == before


def test_a_modules_identity_is_the_same_in_every_process_until_its_file_changes(lib) -> None:
    _mod, path = lib
    code = textwrap.dedent("""
        import sys
        sys.dont_write_bytecode = True
        sys.path.insert(0, sys.argv[1])
        import hr_fp_lib
        from headrace.pipeline.code_digest import code_identity
        def step(b):
            return hr_fp_lib.decode(b)
        print(code_identity(step))
    """)

    def fresh() -> str:
        return subprocess.run([sys.executable, "-c", code, str(path.parent)], check=True,
                              capture_output=True, text=True, timeout=60).stdout

    first = fresh()
    assert fresh() == first
    path.write_text(EDITED)
    assert fresh() != first


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


@pytest.mark.parametrize("init, inner, call", [
    # a submodule the step names through its package (pkg.sub.decode)
    ("from hr_fp_pkg import inner\n", "inner", "hr_fp_pkg.inner.decode(b)"),
    # a function the package re-exports from a module of its own: only the package's file
    # was hashed, and an edit to the module kept the step's identity
    ("from hr_fp_pkg.inner import decode\n", "inner", "hr_fp_pkg.decode(b)"),
])
def test_a_module_a_step_reaches_through_a_package_counts_by_its_source(
        tmp_path, monkeypatch, init, inner, call) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "hr_fp_pkg").mkdir()
    (tmp_path / "hr_fp_pkg" / "__init__.py").write_text(init)
    (tmp_path / "hr_fp_pkg" / f"{inner}.py").write_text(LIB)
    pkg = importlib.import_module("hr_fp_pkg")
    try:
        step = _step(f"def step(b):\n    return {call}\n", hr_fp_pkg=pkg)
        before = code_identity(step)
        (tmp_path / "hr_fp_pkg" / f"{inner}.py").write_text(EDITED)
        importlib.reload(sys.modules[f"hr_fp_pkg.{inner}"])
        assert code_identity(step) != before
    finally:
        for name in (f"hr_fp_pkg.{inner}", "hr_fp_pkg"):
            sys.modules.pop(name, None)


def test_a_callable_class_is_not_keyed_by_the_data_its_methods_fill() -> None:
    """A method filling a module-level memo table changed the step's identity as it ran: the
    cache stopped hitting and a resume said the step had changed."""
    source = ("SEEN = {}\n\nclass Memo:\n    def __call__(self, x):\n        return self._f(x)\n"
              "    def _f(self, x):\n        SEEN[x] = 1\n        return x\n\nstep = Memo()\n")
    namespace: dict = {"__name__": "job"}
    exec(source, namespace)  # noqa: S102 - test code building its own class
    step = namespace["step"]
    before = code_identity(step)
    step(3)
    assert code_identity(step) == before
    assert code_identity(_step(source.replace("SEEN[x] = 1", "SEEN[x] = 2"))) != before
