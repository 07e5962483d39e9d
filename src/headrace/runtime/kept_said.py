"""After which steps a worker said it kept a sample that could not be handed off, so that the
warning (``worker._say_kept``) is said once per step of a pipeline's source, not once per worker
process.

Each worker process used to keep its own set: workers that start anew each epoch (no
``persistent_workers``) said it again, 2 workers over 5 epochs 10 times. So, as
``python_draws`` keeps what workers learned: a pool's flags (one byte per step position, no
lock: a semaphore is a file in /dev/shm, which may be full where the cache filled it, and two
workers keeping a sample at the same moment may each say it, once) live in shared memory in its
``handles.Progress``, every worker the pool starts reads and sets them, the pool adds them here
when it shuts down (``runtime/pool.py``), and the next pool starts from them. Kept by the
step's seed key (``Pipeline.keys``: stable when AutoOrder reorders) for as long as the
pipeline's ``source`` object lives (held weakly).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any

from headrace.pipeline import Pipeline

_said: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()
"""Per source object: the seed keys of the steps after which a kept sample was said."""
_lock = threading.Lock()  # pools shut down on other threads (finalisers, the exit hook)


def shared(ctx: Any, pipeline: Pipeline) -> Any:
    """A pool's flags (``multiprocessing`` context ``ctx``): per step position of ``pipeline``
    (``load`` first), 1 where a kept sample was said already."""
    try:
        with _lock:
            keys = set(_said.get(pipeline.source, ()))
    except TypeError:  # a source that cannot be held weakly: said once per pool
        keys = set()
    return ctx.RawArray("b", [int(k in keys) for k in pipeline.keys])


def first(flags: Any, position: int) -> bool:
    """Whether the sample kept after step ``position`` is the first said (sets its flag)."""
    if flags[position]:
        return False
    flags[position] = 1
    return True


def learn(pipeline: Pipeline, flags: Iterable[Any]) -> None:
    """Keep the steps of ``pipeline`` whose flag is set (per position, ``load`` first)."""
    said = {k for k, f in zip(pipeline.keys, flags, strict=False) if f}
    if not said:
        return
    try:
        with _lock:
            _said.setdefault(pipeline.source, set()).update(said)
    except TypeError:  # a source that cannot be held weakly
        pass
