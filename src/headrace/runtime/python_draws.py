"""Which steps draw from Python's global ``random`` generator, as this process has learned it,
kept across the epochs and worker pools of a pipeline's source.

The runner seeds Python's generator only before the steps flagged as drawing from it; a step's
first draw in a runner that did not know runs its sample again from its start, seeded
(``SampleRunner.python_draws``, ``pipeline/runner.py``). Flags held by a worker process died
with it: workers that start anew each epoch (no ``persistent_workers``), replaced or added
ones, and ``num_workers=0``'s runner, made anew each epoch, learned again, and a
``__getitem__`` that counts its calls saw one more per worker and epoch. So the training
process keeps what was learned here: a pool's workers write a step's flag into the pool's
shared array when they flag it (once per step and worker, never per sample), every worker
the pool starts reads that array at its start, the pool adds it here when it shuts down
(``runtime/pool.py``), and the next pool and the in-process runner start from it.

A flag changes no sample's content: a flagged step is seeded before it runs, an unflagged one
that draws runs again seeded, so either way its draws are the seeded ones (a flagged step that
stops drawing is seeded for nothing: 4 µs). Flags are therefore kept by the step's seed key
(``Pipeline.keys``: stable when AutoOrder reorders) for as long as the pipeline's ``source``
object lives (held weakly), whichever loader over that source learned them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

from headrace.pipeline import Pipeline

_known: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()
"""Per source object: the seed keys of the steps seen drawing from Python's generator."""
_lock = threading.Lock()  # pools shut down on other threads (finalisers, the exit hook)


def known(pipeline: Pipeline) -> list[bool]:
    """Per step position of ``pipeline`` (``load`` first): whether it is known to draw from
    Python's generator."""
    try:
        with _lock:
            keys = set(_known.get(pipeline.source, ()))
    except TypeError:  # a source that cannot be held weakly: nothing kept for it
        return [False] * len(pipeline.step_names)
    return [k in keys for k in pipeline.keys]


def learn(pipeline: Pipeline, flags: Iterable[Any]) -> None:
    """Keep the steps of ``pipeline`` whose flag is true (per position, ``load`` first)."""
    _keep(pipeline, {k for k, f in zip(pipeline.keys, flags, strict=False) if f})


def learn_step(pipeline: Pipeline, step: int) -> None:
    """Keep step position ``step`` of ``pipeline`` (a runner in this process flagged it)."""
    _keep(pipeline, {pipeline.keys[step]})


def _keep(pipeline: Pipeline, drew: set[int]) -> None:
    if not drew:
        return
    try:
        with _lock:
            _known.setdefault(pipeline.source, set()).update(drew)
    except TypeError:  # a source that cannot be held weakly: learned per runner, as before
        pass


def shared(ctx: Any, pipeline: Pipeline) -> Any:
    """A pool's flags (``multiprocessing`` context ``ctx``), one byte per step position, shared
    with its worker processes: what is known so far, written by a worker when it flags a step
    and read by each worker at its start."""
    return ctx.RawArray("b", [int(f) for f in known(pipeline)])



class WorkerFlags:
    """A worker process's flags and its pool's ``shared`` ones (:func:`shared`). ``flags``:
    the list its runners read before each step (``SampleRunner.python_draws``; a list, as
    cheap to read as before), from the shared flags at its start; ``tell(step)``: it flagged
    ``step`` (one byte set, no lock: a flag is only ever set); ``refresh()``: what the pool's
    other workers flagged since (a persistent worker, at each new epoch)."""

    def __init__(self, shared: Any) -> None:
        self.shared = shared
        self.flags = [bool(f) for f in shared]

    def tell(self, step: int) -> None:
        self.shared[step] = 1

    def refresh(self) -> None:
        for i, f in enumerate(self.shared):
            if f:
                self.flags[i] = True
