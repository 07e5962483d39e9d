"""Worker threads' watch for steps drawing from the global random generators.

Worker threads (``Options(executor="threads")``, ``runtime/threadworker.py``) share Python's,
NumPy's and torch's global generators and re-seed none of them, so a step drawing from them
gives content that depends on thread scheduling. Each thread compares the generators' states
around each step of its first ``WATCH_RUNS`` samples (``SampleRunner.on_global_draw``,
``draw_marks.draw_mark``: about 3 µs a step), and a step seen changing them often enough is warned
about, once per step object (the ``Step``, the source for the load): a set of step names hid a
second pipeline's ``<lambda>`` (a bug hunt: 64 of 64 samples unreproducible, unsaid).
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from typing import Any

from headrace import user_frame
from headrace.pipeline.pipeline import LOAD_STEP

WATCH_RUNS = 64
"""Samples each worker thread runs with the global generators' states compared around each
step (:class:`DrawWatch`)."""
DRAW_SEEN = 8
"""Runs of a step seen changing the global generators before it is warned about..."""
DRAW_SHARE = 0.75
"""... which must also be at least this share of its watched runs: the generators are shared,
so a step running while another thread draws sees them change too (an ``ArraySource``'s load
beside a drawing step: 3 of 20 runs), while a step that draws changes them on every run."""

Place = tuple[str, int, dict[str, Any]]
"""Where a warning from a worker thread points: (file name, line, the module's globals)."""


class DrawWatch:
    """A worker thread's watch of the global generators around its steps (first
    ``WATCH_RUNS`` samples): ``ran(step)`` before each step, ``drew(step)`` when their states
    changed around it; warns once a step drew often enough to be the one drawing
    (``DRAW_SEEN``, ``DRAW_SHARE``). A step that draws on some samples only may stay unseen.
    ``objects``: per step position, what the warning is said once for (the source for the
    load, else the ``Step``): two pipelines' steps of one name (two ``<lambda>``) are each
    warned about."""

    def __init__(self, names: list[str], objects: list[Any], place: Place | None) -> None:
        self.names, self.objects, self.place = names, objects, place
        self.runs = [0] * len(names)
        self.changed = [0] * len(names)

    def ran(self, step: int) -> None:
        self.runs[step] += 1

    def drew(self, step: int) -> None:
        self.changed[step] += 1
        if self.changed[step] >= DRAW_SEEN and self.changed[step] >= DRAW_SHARE * self.runs[step]:
            _warn_draw(self.names[step], self.objects[step], self.place)


_warned: dict[int, Any] = {}
"""What a worker thread of this process warned about (:func:`_warn_draw`), by ``id``: a weak
reference to it, or the object itself where it takes none (kept: its ``id`` stays its own)."""
_lock = threading.Lock()


def _first_time(obj: Any) -> bool:
    """True the first time it is asked about ``obj`` (a source or a ``Step``) in this process."""
    with _lock:
        known = _warned.get(id(obj))
        if known is obj or (isinstance(known, weakref.ref) and known() is obj):
            return False
        try:
            _warned[id(obj)] = weakref.ref(obj)
        except TypeError:  # no weak references (``__slots__``)
            _warned[id(obj)] = obj
        return True


def _defined_at(step: Any) -> str:
    """Where the function of ``step`` (a ``Step``) is defined, as a sentence; "" when it has no
    code of its own (a builtin, a callable object): it tells two ``<lambda>`` apart."""
    fn = getattr(step, "fn", None)
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    return f" Its function: {code.co_filename}:{code.co_firstlineno}."


def _warn_draw(name: str, obj: Any, place: Place | None) -> None:
    """Warn, once per step object (``obj``) and process, that the global generators changed
    while the step ``name`` ran in a worker thread, at ``place`` (the user's line that started
    the thread; None: the thread's own outermost frame)."""
    if not _first_time(obj):
        return
    where = "the source's load" if name == LOAD_STEP else f"step {name!r}"
    defined = "" if name == LOAD_STEP else _defined_at(obj)
    msg = (f"headrace: Python's, NumPy's or torch's global random generator changed while "
           f"{where} ran in a worker thread (executor=\"threads\"): worker threads share those "
           "generators and re-seed none, so what it draws from them differs run to run and "
           "from worker processes. Give the step random=True and draw from its rng, or use "
           f"worker processes.{defined} (Said once per step; another thread drawing at "
           "the same time, such as the training loop, changes them too.)")
    if place is None:
        user_frame.warn(msg)
        return
    filename, lineno, module_globals = place
    warnings.warn_explicit(msg, UserWarning, filename, lineno,
                           module=module_globals.get("__name__", filename),
                           registry=module_globals.setdefault("__warningregistry__", {}),
                           module_globals=module_globals)
