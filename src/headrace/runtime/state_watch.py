"""Per-worker state that a source or a step makes while it runs samples (``executor="auto"``).

A worker process has its own copy of the source and of the step objects, so state they keep
for themselves is per worker: a file handle opened on first use (``self.f = open(...)``, then
``seek`` and ``read``), a reader, a counter. Worker threads share one object: two threads
seeking and reading through one handle deliver each other's bytes (a hunt: 377 distinct records
of 400, no error). The probing worker processes therefore compare, after each sample they run,
the attributes of the source and of each step's object (its callable object, or the object of
a bound method) with what they were before the first sample: an attribute that appeared or
now names another object (``is``) is such state, and ``executor="auto"`` keeps processes
(``planner.executor.state_reason``). A change inside an attribute's object (a list appended
to, a dict filled) is not seen: only the bindings are compared.

The first change a worker sees goes to its slot of ``handles.Progress`` (``state_changed``:
1 + the step's position, 0 for the source's ``load``; ``state_attr``: the attribute's name,
at most ``ATTR_BYTES`` bytes of UTF-8).
"""

from __future__ import annotations

import types
from typing import Any

ATTR_BYTES = 64
"""Bytes of an attribute's name kept per worker slot (longer names are cut)."""

_NOT_WATCHED = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type)


def watched_objects(pipeline: Any) -> list[tuple[int, Any]]:
    """``(position, object)`` pairs whose attributes :class:`StateWatch` compares: the
    source's (position 0) and each step's callable object or bound method's object."""
    from headrace.pipeline.timed import unwrapped

    out: list[tuple[int, Any]] = [(0, pipeline.source)]
    for pos, step in enumerate(pipeline.steps, start=1):
        fn = unwrapped(getattr(step, "fn", step))
        obj = getattr(fn, "__self__", fn)  # a bound method: its object
        if not isinstance(obj, _NOT_WATCHED) and hasattr(obj, "__dict__"):
            out.append((pos, obj))
    return out


class StateWatch:
    """Compares the watched objects' attribute bindings with a snapshot taken at its making;
    :meth:`check` returns the first change seen, ``(position, attribute)``, once."""

    def __init__(self, pipeline: Any) -> None:
        # the snapshot holds the values themselves (not their ids, which a freed value's
        # successor may reuse)
        self._snaps = [(pos, obj, dict(vars(obj))) for pos, obj in watched_objects(pipeline)]
        self.seen: tuple[int, str] | None = None

    def check(self) -> tuple[int, str] | None:
        """The first attribute added or rebound since the snapshot (``(position, name)``),
        on the call that first sees it; None otherwise (and on every call after that)."""
        if self.seen is not None:
            return None
        for pos, obj, snap in self._snaps:
            now = vars(obj)
            if len(now) == len(snap) and all(now.get(k, snap) is v for k, v in snap.items()):
                continue
            name = next((k for k in now if k not in snap or now[k] is not snap[k]),
                        next(iter(snap.keys() - now.keys()), "?"))
            self.seen = (pos, name)
            return self.seen
        return None


def note(progress: Any, slot: int, position: int, name: str) -> None:
    """Write a change seen by worker ``slot`` to ``progress`` (name first: the training
    process reads ``state_changed`` and then the name)."""
    if progress.state_changed[slot]:
        return
    raw = name.encode("utf-8", "replace")[:ATTR_BYTES].ljust(ATTR_BYTES, b"\0")
    progress.state_attr[slot * ATTR_BYTES:(slot + 1) * ATTR_BYTES] = raw
    progress.state_changed[slot] = position + 1


def attr_of(progress: Any, slot: int) -> str:
    """The attribute name worker ``slot`` noted (:func:`note`)."""
    raw = bytes(progress.state_attr[slot * ATTR_BYTES:(slot + 1) * ATTR_BYTES])
    return raw.rstrip(b"\0").decode("utf-8", "replace")
