"""Worker threads' watch for steps drawing from the global random generators.

Worker threads (``Options(executor="threads")``, ``runtime/threadworker.py``) share Python's,
NumPy's and torch's global generators and re-seed none of them, so a step drawing from them
gives content that depends on thread scheduling. Each thread compares the generators' states
around each step of its first ``WATCH_RUNS`` samples (``SampleRunner.on_global_draw``,
``seeding.draw_mark``: about 4 µs a step), and a step seen changing them is warned about once.

A change is the step's own only when no other worker thread was inside a step meanwhile: the
states are shared, and a step beside a drawing one sees them change too (a source's load beside
a drawing step: 3 of 20 runs; a step sleeping beside one drawing on every sample: 112 of 128).
Every worker thread of the process counts itself in and out of each of its steps, watched or
not (:class:`DrawWatch` ``enter``/``leave``), and only a watched run during which no other
worker thread entered or was inside a step (an *alone* run) is evidence. Such runs are rare
where the threads are always in a step (steps that let go of the GIL: 2 to 4 of 128 to 192
watched runs), so a watched step with fewer than ``ALONE_RUNS`` alone runs, process-wide, runs
as a *probe*: other
worker threads finish the step they are in and wait at their next one until it ends (each wait
at most ``PROBE_WAIT_S``; a probe that did not get the others out runs anyway, as no evidence).
``DRAW_SEEN`` changes on alone runs make the warning, whatever share of the step's samples
draws: a step drawing on a quarter of its samples used to stay silent (it had to change the
states on 3/4 of all its watched runs, which a neighbour's draws also made; a bug hunt: 32 of
128 samples differed run to run, unsaid), and a step sleeping beside a drawing one was named.

What this cannot tell apart: a draw by a thread outside the steps (the training loop, a
``collate_fn`` or a sampler drawing from the global generators) during an alone run counts
against the step; the warning says so. The evidence is kept per step object (the ``Step``, the
source for the load) for the process's life, so probes stall a process's first samples of a
pipeline only (about ``ALONE_RUNS`` runs of each step one thread at a time), not every epoch's.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
import warnings
import weakref
from typing import Any

from headrace import user_frame
from headrace.pipeline.pipeline import LOAD_STEP

WATCH_RUNS = 64
"""Samples each worker thread runs with the global generators' states compared around each
step (:class:`DrawWatch`)."""
ALONE_RUNS = 64
"""Alone runs of a step object wanted, process-wide, before its runs stop being probes (and
probes tried at most, per step object): a step drawing on 10% of its samples shows on 6.4 of
them on average."""
DRAW_SEEN = 2
"""Alone runs of a step seen changing the global generators before it is warned about. Two,
not one: a draw of the training loop or of a thread outside the steps can land in one run."""
PROBE_WAIT_S = 0.1
"""Seconds a probe waits for the other worker threads to leave their steps, and a thread waits
at a step's start for another's probe to end, at most (a step may wait for the training loop,
which may wait for the other thread's sample)."""

Place = tuple[str, int, dict[str, Any]]
"""Where a warning from a worker thread points: (file name, line, the module's globals)."""


@dataclasses.dataclass
class _Evidence:
    """What the worker threads of this process saw of one step object on alone runs."""

    ref: Any
    """A weak reference to the object, or the object itself where it takes none (kept: its
    ``id``, this record's key, stays its own)."""
    alone: int = 0
    """Watched alone runs."""
    changed: int = 0
    """Of those, runs that changed the global generators."""
    probes: int = 0
    """Probes tried."""
    warned: bool = False

    def of(self, obj: Any) -> bool:
        ref = self.ref
        return ref is obj or (isinstance(ref, weakref.ref) and ref() is obj)


class _Steps:
    """This process's worker threads' watches (every pool's: the generators are the
    process's) and the probe running, if any."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        """Held to change the fields below; a probe's start and end are notified on it."""
        self.watches: tuple[DrawWatch, ...] = ()
        """Of the live worker threads (replaced, never changed in place: read without the lock)."""
        self.probe: DrawWatch | None = None
        """The thread whose step runs as a probe: no other enters a step until it ends."""
        self.evidence: dict[int, _Evidence] = {}
        """By ``id`` of the step object."""

    def record(self, obj: Any) -> _Evidence:
        with self.cv:
            ev = self.evidence.get(id(obj))
            if ev is None or not ev.of(obj):
                try:
                    ref: Any = weakref.ref(obj)
                except TypeError:  # no weak references (``__slots__``)
                    ref = obj
                ev = self.evidence[id(obj)] = _Evidence(ref)
            return ev


_steps = _Steps()


class DrawWatch:
    """A worker thread's part (module docstring): ``enter(step)`` before each step (it leaves
    the previous one), ``leave()`` after the sample's last, ``drew(step)`` when the generators'
    states changed around ``step``, ``close()`` when the thread ends; ``watching``: the
    thread's runs are watched (its first ``WATCH_RUNS``: ``drew`` is called). ``objects``: per
    step position, the object the evidence and the warning are kept for (the source for the
    load, else the ``Step``): two pipelines' steps of one name (two ``<lambda>``) are each
    warned about.

    Not watching, a thread only sets its own ``inside`` and ``entries`` (well under a
    microsecond a step); a watched run reads the others' without a lock: ``inside`` is set
    before ``entries`` moves, so a thread read as outside at a run's start has its ``entries``
    moved by the run's end if it entered a step meanwhile (reads and writes of one attribute
    are atomic, and seen in program order, under the GIL)."""

    def __init__(self, names: list[str], objects: list[Any], place: Place | None) -> None:
        self.names, self.place = names, place
        self.evidence = [_steps.record(o) for o in objects]
        self.watching = True
        self.inside = False
        """This thread is inside a step."""
        self.entries = 0
        """Steps this thread entered."""
        self.stuck = False
        """A probe waited for this thread to leave its step in vain (until it leaves it)."""
        self._others: list[tuple[DrawWatch, int]] | None = None
        """In a watched run entered alone: the other threads and their ``entries`` then."""
        self._watches: tuple[DrawWatch, ...] = ()  # ``_steps.watches`` then
        self._step = 0
        self._changed = False
        with _steps.cv:
            _steps.watches = (*_steps.watches, self)

    def enter(self, step: int) -> None:
        if self.inside:
            self.leave()
        steps = _steps
        if steps.probe is not None:  # another thread's step runs alone: wait for it
            with steps.cv:
                steps.cv.wait_for(lambda: steps.probe is None, PROBE_WAIT_S)
        if not self.watching:
            self.inside = True
            self.entries += 1
            return
        ev = self.evidence[step]
        if not ev.warned and ev.alone < ALONE_RUNS and ev.probes < ALONE_RUNS:
            self._probe(ev)
        self.inside = True
        self.entries += 1
        self._step, self._changed = step, False
        watches = steps.watches
        others = [(w, w.entries) for w in watches if w is not self]
        self._others = None if any(w.inside for w, _ in others) else others
        self._watches = watches

    def _probe(self, ev: _Evidence) -> None:
        """Make this run a probe: wait (``PROBE_WAIT_S`` at most) for the other threads to
        leave their steps; they do not enter another until it ends (``leave``). Not while a
        thread a probe waited for in vain is still in that step (a thread abandoned in a step
        never leaves it)."""
        steps = _steps
        with steps.cv:
            others = [w for w in steps.watches if w is not self]
            if steps.probe is not None or any(w.inside and w.stuck for w in others):
                return
            steps.probe = self
            ev.probes += 1
            # a thread leaving notifies only when it sees the probe set: re-read every 2 ms
            deadline = time.monotonic() + PROBE_WAIT_S
            while any(w.inside for w in others):
                left = deadline - time.monotonic()
                if left <= 0:  # they are stuck in that step: no probe waits for them again
                    for w in others:
                        w.stuck = w.stuck or w.inside
                    return
                steps.cv.wait(min(left, 0.002))

    def drew(self, step: int) -> None:
        self._changed = True

    def leave(self) -> None:
        if not self.inside:
            return
        self.inside = False
        if self.stuck:
            self.stuck = False
        steps = _steps
        if steps.probe is not None:
            with steps.cv:
                if steps.probe is self:
                    steps.probe = None
                steps.cv.notify_all()
        others, self._others = self._others, None
        if others is None or not self.watching:
            return
        if steps.watches is not self._watches or any(w.entries != n for w, n in others):
            return  # another thread entered a step (or started) meanwhile
        ev = self.evidence[self._step]
        with steps.cv:
            ev.alone += 1
            ev.changed += self._changed
            warn = ev.changed >= DRAW_SEEN and not ev.warned
            ev.warned = ev.warned or warn
        if warn:
            _warn_draw(self.names[self._step], ev.ref, self.place)

    def close(self) -> None:
        """The thread ends: leave its step, and the watches the others read."""
        self.leave()
        with _steps.cv:
            _steps.watches = tuple(w for w in _steps.watches if w is not self)


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


def _warn_draw(name: str, ref: Any, place: Place | None) -> None:
    """Warn (once per step object and process: the caller's ``_Evidence.warned``) that the
    global generators changed while the step ``name`` ran in a worker thread, at ``place``
    (the user's line that started the thread; None: the thread's own outermost frame).
    ``ref``: the step object, or a weak reference to it."""
    obj = ref() if isinstance(ref, weakref.ref) else ref
    where = "the source's load" if name == LOAD_STEP else f"step {name!r}"
    defined = "" if name == LOAD_STEP else _defined_at(obj)
    msg = (f"headrace: Python's, NumPy's or torch's global random generator changed while "
           f"{where} ran in a worker thread (executor=\"threads\"): worker threads share those "
           "generators and re-seed none, so what it draws from them differs run to run and "
           "from worker processes. Give the step random=True and draw from its rng, or use "
           f"worker processes.{defined} (Said once per step; draws of another thread "
           "outside the steps at the same time, such as the training loop, change them too.)")
    if place is None:
        user_frame.warn(msg)
        return
    filename, lineno, module_globals = place
    warnings.warn_explicit(msg, UserWarning, filename, lineno,
                           module=module_globals.get("__name__", filename),
                           registry=module_globals.setdefault("__warningregistry__", {}),
                           module_globals=module_globals)
