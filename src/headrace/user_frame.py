"""Warnings that point at the user's line, whatever depth of headrace sits between.

A warning's ``stacklevel`` counted by hand points inside headrace as soon as a call is added
on the way, or where two paths reach the same warning at different depths (an epoch that ends
in ``next()`` with or without worker processes): a hunt found four of them naming
``loader.py`` or ``monitor.py`` as the offending line, which Python's default filter then
shows once per headrace line rather than once per line of the script. Here the level is
computed: the first frame outside headrace (and ``contextlib``, whose frames a ``with``
statement adds) is the caller the warning names.
"""

from __future__ import annotations

import sys
import warnings

_INSIDE = ("headrace.", "contextlib")
"""Module name prefixes of the frames a warning skips (headrace's own, and ``contextlib``'s)."""


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called by the function calling this that names
    the first frame outside headrace (the script's ``for`` line, ``iter()``,
    ``load_state_dict()``; a framework's, where it made the call). On a thread that holds no
    such frame, the outermost one."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` at the user's line (:func:`user_stacklevel`)."""
    warnings.warn(message, category, stacklevel=user_stacklevel())
