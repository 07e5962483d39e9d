"""A step's identity counts the settings its helpers and its class's methods read, not the
tables they fill. A deterministic step reading a module global through a helper (or through a
callable class's method) kept its identity when the script changed the global between epochs
(a curriculum), and the default cache served the first epoch's samples (a bug hunt)."""

from __future__ import annotations

import pytest

from headrace.pipeline.code_digest import code_identity


def _module(source: str) -> dict:
    """The namespace of a module ``job`` whose code is ``source``."""
    namespace: dict = {"__name__": "job"}
    exec(source, namespace)  # noqa: S102 - test code building its own functions
    return namespace


HELPER = """
SCALE = 1

def helper(x):
    return x * SCALE

def step(x):
    return helper(x)
"""

METHOD = """
SCALE = 1

class Prep:
    def __call__(self, x):
        return x * SCALE

step = Prep()
"""

# a method calling a helper of its module, which reads the setting
METHOD_HELPER = """
SCALE = 1

def helper(x):
    return x * SCALE

class Prep:
    def __call__(self, x):
        return helper(x)

step = Prep()
"""


@pytest.mark.parametrize("source", [HELPER, METHOD, METHOD_HELPER],
                         ids=["helper", "method", "method-helper"])
@pytest.mark.parametrize("then, now", [
    (1, 3), (0.5, 0.25), ("bilinear", "nearest"), (b"a", b"b"), (None, 2),
    ((224, 224), (256, 256)), (frozenset({1}), frozenset({2})), (((1, 2), "a"), ((1, 3), "a")),
])
def test_a_scalar_setting_read_by_a_helper_or_a_method_counts_by_value(source, then, now):
    module = _module(source.replace("SCALE = 1", f"SCALE = {then!r}"))
    before = code_identity(module["step"])
    module["SCALE"] = now
    assert code_identity(module["step"]) != before
    module["SCALE"] = then
    assert code_identity(module["step"]) == before


def _owned(owner: str, globals_: str, body: str) -> str:
    """A module defining ``globals_`` and a step whose code is ``body`` (the lines of a
    function of ``x``, indented four spaces): in a helper ``step`` calls (``owner`` "helper"),
    or in a helper method ``_f`` of the callable class ``step`` is an instance of."""
    if owner == "helper":
        return f"{globals_}\ndef helper(x):\n{body}\ndef step(x):\n    return helper(x)\n"
    method = "".join(f"    {line}\n" for line in body.splitlines())
    return (f"{globals_}\nclass Step:\n    def __call__(self, x):\n        return self._f(x)\n\n"
            f"    def _f(self, x):\n{method}\nstep = Step()\n")


@pytest.mark.parametrize("table, fill", [
    ("{}", "MEMO[x] = SCALE"), ("[]", "MEMO.append(x)"), ("set()", "MEMO.add(x)"),
])
@pytest.mark.parametrize("owner", ["helper", "method"])
def test_a_memo_table_a_helper_or_method_fills_does_not_count_its_setting_does(
        owner, table, fill):
    """By value the table changed the step's identity as the step ran: the cache stopped
    hitting, a resume said the step changed. The setting read beside it still counts."""
    module = _module(_owned(owner, f"MEMO = {table}\nSCALE = 1\n",
                            f"    {fill}\n    return x * SCALE\n"))
    step = module["step"]
    before = code_identity(step)
    for x in range(3):
        step(x)
    assert module["MEMO"]  # filled
    assert code_identity(step) == before
    module["SCALE"] = 2
    assert code_identity(step) != before


@pytest.mark.parametrize("owner", ["helper", "method"])
def test_a_global_built_on_first_use_does_not_change_the_steps_identity(owner):
    """``global TABLE; if TABLE is None: TABLE = ...``: None is a scalar, but the code assigns
    the name itself, so it counts by name (else the identity changed at the first sample)."""
    module = _module(_owned(owner, "TABLE = None\nSCALE = 1\n",
                            "    global TABLE\n    if TABLE is None:\n"
                            "        TABLE = {'k': 2}\n    return x * TABLE['k'] * SCALE\n"))
    step = module["step"]
    before = code_identity(step)
    assert step(1) == 2 and module["TABLE"] is not None
    assert code_identity(step) == before
    module["SCALE"] = 2
    assert code_identity(step) != before


def test_a_helper_of_a_helper_is_followed():
    source = ("SCALE = 1\n\ndef inner(x):\n    return x * SCALE\n\n"
              "def outer(x):\n    return inner(x) + 1\n\ndef step(x):\n    return outer(x)\n")
    module = _module(source)
    before = code_identity(module["step"])
    module["SCALE"] = 3
    assert code_identity(module["step"]) != before
    edited = _module(source.replace("x * SCALE", "x + SCALE"))  # the inner helper's code
    assert code_identity(edited["step"]) != before
    assert code_identity(_module(source)["step"]) == before


@pytest.mark.parametrize("source", [
    # a helper calling itself
    "SCALE = 1\n\ndef walk(x, n):\n    return x * SCALE if n == 0 else walk(x, n - 1)\n\n"
    "def step(x):\n    return walk(x, 2)\n",
    # two helpers calling each other, the setting read by the second
    "SCALE = 1\n\ndef even(x, n):\n    return x if n == 0 else odd(x, n - 1)\n\n"
    "def odd(x, n):\n    return x * SCALE if n == 0 else even(x, n - 1)\n\n"
    "def step(x):\n    return even(x, 3)\n",
    # the step itself called back by its helper
    "SCALE = 1\n\ndef back(x):\n    return step(x - 1) if x > 0 else SCALE\n\n"
    "def step(x):\n    return back(x)\n",
], ids=["self", "mutual", "step"])
def test_recursive_helpers_are_followed_once(source):
    module = _module(source)
    before = code_identity(module["step"])
    assert code_identity(module["step"]) == before
    module["SCALE"] = 3
    assert code_identity(module["step"]) != before


def test_a_long_chain_of_helpers_is_followed_to_a_bound():
    def chain(k: int) -> dict:  # 200 helpers, each calling the next; the setting at the end
        helpers = "".join(f"def h{i}(x):\n    return h{i + 1}(x){' + 1' * (i == 5 and k)}\n\n"
                          for i in range(200))
        return _module(f"SCALE = 1\n\n{helpers}def h200(x):\n    return x * SCALE\n\n"
                       "def step(x):\n    return h0(x)\n")

    before = code_identity(chain(0)["step"])  # ends: at most MAX_HELPERS functions followed
    assert code_identity(chain(1)["step"]) != before  # h5 edited: within the bound


def test_a_step_reading_more_than_64_globals_counts_every_one():
    """The globals a step reads were cut at the first 64 names, sorted: the 70th's value was
    not seen."""
    names = [f"G{i:02d}" for i in range(70)]
    source = "".join(f"{n} = 1\n" for n in names)
    source += f"def step(x):\n    return x + {' + '.join(names)}\n"
    module = _module(source)
    before = code_identity(module["step"])
    module["G69"] = 2
    assert code_identity(module["step"]) != before


@pytest.mark.parametrize("owner", ["helper", "method"])
def test_a_long_tuple_a_helper_or_method_reads_counts_by_value(owner):
    """A tuple of more than 64 scalars counted by name when a helper or method read it: a
    100-entry table changed at entry 90 kept the step's identity."""
    table = tuple(range(100))
    module = _module(_owned(owner, f"TABLE = {table!r}\n", "    return TABLE[x]\n"))
    before = code_identity(module["step"])
    module["TABLE"] = table[:90] + (-1,) + table[91:]
    assert code_identity(module["step"]) != before
