"""``headrace.user_frame``: a warning names the first frame outside headrace, at any depth."""

import warnings

import pytest

from headrace.user_frame import warn


def _inside(depth: int):
    """A function of a module named ``headrace.fake`` that reaches ``warn`` through ``depth``
    nested headrace frames (as a warning issued from a helper of a helper does)."""
    space = {"__name__": "headrace.fake", "warn": warn}
    exec("def f0():\n    warn('told')\n", space)
    for k in range(1, depth):
        exec(f"def f{k}():\n    f{k - 1}()\n", space)
    return space[f"f{depth - 1}"]


@pytest.mark.parametrize("depth", [1, 2, 5])
def test_a_warning_names_the_callers_line_whatever_the_depth_inside(depth):
    f = _inside(depth)
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        f()  # the line named
    assert len(got) == 1 and got[0].filename == __file__
    assert got[0].lineno == test_a_warning_names_the_callers_line_whatever_the_depth_inside \
        .__code__.co_firstlineno + 5  # (the decorator's line is the first)
