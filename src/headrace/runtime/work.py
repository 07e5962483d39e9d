"""What one epoch's work is: its spec, the record of each sample in flight, its counters.

Plain data shared by the scheduler thread (``runtime/scheduler.py``) and the loader.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Number
from typing import Any

from headrace.errors import (
    StepError,
    WorkerDiedError,
    message_of,
    step_error_for,
    worker_start_error,
)
from headrace.runtime.batcher import Batcher
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.bufferpool import BufferPool
from headrace.runtime.worker import Task


def default_max_in_flight(batch_size: int, workers: int, prefetch_factor: int) -> int:
    """Samples pulled from the sampler and not yet yielded, at most, unless the user set
    ``Options(max_in_flight=...)``: torch's ``prefetch_factor`` batches per worker, and never
    less than two batches plus one sample per worker (so a batch can fill while one is out)."""
    return max(2 * batch_size + workers, prefetch_factor * workers * batch_size)


@dataclass
class EpochSpec:
    """What one epoch is: the sampler stream and how to turn samples into batches."""

    epoch: int
    base_seed: int
    groups: Iterator[Any]  # the index sampler's output: lists of indices, or single indices
    auto_collation: bool
    batcher: Batcher
    collate: Callable[[Any], Any]
    pin: Callable[[Any], Any] | None
    max_in_flight: int  # samples pulled and not yet settled, at most (unless ``batch_bound``)
    handoff: bool
    slow_lane_share: float
    on_error: str
    max_restarts: int
    delivered: Bitmap  # positions delivered before (resume); read-only for the scheduler
    total_positions: int | None  # samples in the epoch when the sampler knows, else None
    sample_timeout_s: float | None = None  # a sample running longer is a hung step
    buffers: BufferPool | None = None  # batch memory reused across batches (None: fresh)
    ods: Any = None  # cache.ods_epoch.OdsEpoch: which sample fills a position (Cache(ods=True))
    collate_threads: int = 1  # threads running a user collate_fn (Options.collate_threads)
    may_repeat: bool = True  # the sampler may yield an index twice (runtime/draws.py)
    collate_place: Any = None  # runtime.collate_rng.CollatePlace for a user collate_fn, or None
    batch_bound: int | None = None
    """A user batch sampler read in batches (``Feed.per_batch``): the batches ``groups`` is
    read ahead of those settled, which bounds what is in flight; ``max_in_flight`` then does
    not (it counts samples from a guessed batch size: 1 for a batch sampler without
    ``batch_size``, which kept one batch in flight where torch keeps ``prefetch_factor x
    workers``)."""

    def batches_in_flight(self) -> int:
        """Batches the in-flight bound holds at most (the autoscaler reads the batch queue's
        length against it)."""
        return self.batch_bound or max(1, self.max_in_flight // self.batcher.batch_size)


@dataclass
class Rec:
    """A sample in flight."""

    position: int
    index: int
    task: Task
    slow: bool = False
    attempts: int = 0
    step_s: float = 0.0  # step time spent so far (s)
    worker: int | None = None
    died_on: tuple[int, ...] = ()  # the slots of the workers that died running it
    died_in: int | None = None  # the step position the last of them died in (None: unknown)


class Counters:
    """Numbers the scheduler thread writes and ``loader.stats()`` reads (plain ints/floats)."""

    def __init__(self) -> None:
        self.fast = 0
        self.slow = 0
        self.skipped = 0
        self.retried = 0
        self.moved = 0  # tasks moved from behind a slow sample to an idle worker
        self.failed = 0  # samples whose error was raised to the training loop (on_error="raise")
        self.discarded = 0  # finished samples never delivered: of a batch that raised instead
        # (as torch loses them), or ``dropped``
        self.dropped = 0  # finished samples of a short last batch that drop_last forbids
        self.batches_gone = 0  # sampler batches that settled with nothing for the training
        # loop: every sample skipped (on_error="skip"), or drop_last's short last batch
        self.batches_out = 0  # batches put on the training loop's queue ("batch", "future",
        # "deferred"): at the end, EpochIterator checks that each reached the training loop
        self.scheduler_cpu_s = 0.0
        self.forwarded = 0  # slow-lane samples' partial values sent on to a worker
        self.forward_cpu_s = 0.0  # scheduler-thread CPU seconds those cost (ring copy, encode, send)
        self.shared_samples = 0  # samples that came in a result message carrying several
        self.task_messages = 0  # task messages to worker processes carrying several samples
        self.sent_bytes = 0  # bytes of the last finished sample read from a worker process:
        # its ring's, and its arrays' beside the ring as that worker last encoded a value
        # (``Ring.beside``); ``queueing.QUEUE_BYTES`` caps a queue by them, profiled or not


class Fatal(Exception):
    """Ends the epoch: carries the error the training loop will see."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(message_of(error))
        self.error = error


def collate_error(e: Exception, indices: list[int],
                  samples: Sequence[Any] | Callable[[], Sequence[Any]] = ()) -> StepError:
    """A collate_fn failure, naming the samples of the batch, or saying it had none.
    ``samples``: the batch's samples, as ``collate_fn`` got them (or a function returning
    them, called only here, where its failure costs the hint only); where one differs from the
    first in type or shape (:func:`sample_difference`), the message names it, the usual cause
    of a collation error. Samples that all agree get no such hint: a ``collate_fn`` that
    is not callable, or a type ``default_collate`` refuses in every sample (``None``, a
    ``set``, a dataclass, sparse tensors), is not a mismatch."""
    original = traceback.format_exc()  # first: the look at the samples may raise and catch
    if indices:
        where = f"batch of sample indices [{_shown(indices)}]"
        with contextlib.suppress(Exception):  # a sample whose inspection raises: no hint
            differs = sample_difference(samples() if callable(samples) else samples, indices)
            if differs is not None:
                where += f"; {differs}"
    else:
        where = "an empty batch from the batch_sampler"
    return step_error_for(
        type(e), indices[0] if indices else None, "collate_fn", type(e).__qualname__,
        f"{message_of(e)} ({where})", original,
    )


_LOOK_DEPTH = 8
"""Containers nested deeper than this in a sample are not compared (``sample_difference``)."""
_LOOK_ITEMS = 64
"""Items of a list, tuple or dict compared at most, per container (``sample_difference``)."""
_LOOK_VALUES = 4096
"""Values compared at most in all, over a batch's samples (``sample_difference``)."""


def sample_difference(samples: Sequence[Any], indices: list[int]) -> str | None:
    """Where the first of ``samples`` (of dataset ``indices``) that differs from the first
    sample does, in words (``"sample index 3 has shape (20, 20, 3) at [0] where sample index
    0 has (16, 16, 3)"``); None where they agree. Compared: the types of values (any two
    numbers agree: torch makes one tensor of ints, floats and bools), the shapes of tensors and
    arrays (not their dtypes, which ``torch.stack`` promotes), the lengths of lists and tuples
    and the keys of dicts, down to ``_LOOK_DEPTH`` levels, ``_LOOK_ITEMS`` items each and
    ``_LOOK_VALUES`` values in all. Read on the error path only: a few µs per sample."""
    if len(samples) < 2 or len(indices) != len(samples):
        return None
    first, budget = samples[0], [_LOOK_VALUES]
    for index, sample in zip(indices[1:], samples[1:], strict=True):
        found = _difference(first, sample, "", _LOOK_DEPTH, budget)
        if found is not None:
            at, theirs, ours = found
            return (f"sample index {index} has {theirs}{f' at {at}' if at else ''} where sample "
                    f"index {indices[0]} has {ours}")
    return None


def _difference(a: Any, b: Any, at: str, depth: int,
                budget: list[int]) -> tuple[str, str, str] | None:
    """The first place (a path like ``[0]['image']``) where ``b`` differs from ``a``, with
    what each has there; None where they agree (see :func:`sample_difference`), or where
    ``budget[0]``, the values left to compare, ran out."""
    budget[0] -= 1
    if budget[0] < 0:
        return None
    if isinstance(a, Number) and isinstance(b, Number):
        return None
    if type(a) is not type(b):
        return at, f"type {type(b).__qualname__}", type(a).__qualname__
    if depth <= 0:
        return None
    shape_a, shape_b = getattr(a, "shape", None), getattr(b, "shape", None)
    if (isinstance(shape_a, tuple) and isinstance(shape_b, tuple)  # tensors (a Size is a
            and shape_a != shape_b):  # tuple), arrays
        return at, f"shape {tuple(shape_b)}", f"{tuple(shape_a)}"
    if isinstance(a, Mapping):
        if set(a) != set(b):
            return at, f"keys {_keys(b)}", f"{_keys(a)}"
        for key in itertools.islice(a, _LOOK_ITEMS):
            found = _difference(a[key], b[key], f"{at}[{key!r}]", depth - 1, budget)
            if found is not None:
                return found
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return at, f"length {len(b)}", f"{len(a)}"
        for i, (x, y) in enumerate(itertools.islice(zip(a, b, strict=True), _LOOK_ITEMS)):
            found = _difference(x, y, f"{at}[{i}]", depth - 1, budget)
            if found is not None:
                return found
    return None


def _keys(d: Mapping[Any, Any]) -> str:
    """A dict's keys as a message shows them: the first 8, in order."""
    keys = list(itertools.islice(d, 9))
    return "[" + ", ".join(map(repr, keys[:8])) + (", ...]" if len(keys) > 8 else "]")


class CutShort:
    """The rule for a call that an exception which is not an ``Exception`` cut short
    (``SystemExit``, a user's own ``BaseException``) in the training loop's thread, where a
    signal handler may have raised it (SIGTERM's ``SystemExit``): the call runs again once,
    and when its re-run raises such an exception too, it is the call's own doing and fails
    (user code raising it at every call made every later ``next()`` raise it for ever). A
    ``KeyboardInterrupt`` never fails it: the call runs again, however often. ``what``
    names the call (a sample's position, a batch's positions, a collation), compared with
    ``==``."""

    __slots__ = ("_what",)

    def __init__(self) -> None:
        self._what: Any = None

    def fails(self, what: Any, e: BaseException) -> bool:
        """``what`` was cut short by ``e``: True when it fails now (its re-run raised too)."""
        if isinstance(e, KeyboardInterrupt):
            return False
        if self._what is not None and self._what == what:
            self._what = None
            return True
        self._what = what
        return False

    def ran(self) -> None:
        """The call completed (or was settled otherwise): a later cut starts over."""
        self._what = None


def note_collate(e: BaseException, indices: list[int]) -> None:
    """Note on ``e``, an exception a ``collate_fn`` raised that is not an ``Exception``
    (``SystemExit``, ``KeyboardInterrupt``, a user's own ``BaseException``), where it came
    from: it reaches the training loop as itself, as torch's does (an ``except`` clause for
    it must still catch it, and one for ``Exception`` must not), so it cannot become a
    ``StepError``. A note is all a traceback can show of the step and the batch (Python 3.11
    prints ``__notes__``; 3.10 only keeps them)."""
    where = f"the batch of sample indices [{_shown(indices)}]" if indices else "an empty batch"
    note = f"headrace: raised in step 'collate_fn' (the loader's collate_fn) on {where}"
    with contextlib.suppress(Exception):  # an exception class that refuses attributes
        if hasattr(e, "add_note"):
            e.add_note(note)
        else:  # pragma: no cover - Python 3.10
            e.__notes__ = [*getattr(e, "__notes__", ()), note]


def _shown(indices: list[int]) -> str:
    """A batch's sample indices as an error shows them: the first 16."""
    return ", ".join(map(str, indices[:16])) + (", ..." if len(indices) > 16 else "")


def _signal_name(exitcode: int | None) -> str | None:
    """The signal a negative exit code says ended the process (``-6``: ``SIGABRT``; an unknown
    number: ``signal 200``); None for a process that exited or is not known to have ended."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def how_it_ended(exitcode: int | None) -> str:
    """A worker process's exit code in words: a negative one names the signal that ended it
    (``-6``: ``killed by SIGABRT``), which a bare number hid."""
    name = _signal_name(exitcode)
    if name is not None:
        return f"killed by {name}"
    return "exit code unknown" if exitcode is None else f"exit code {exitcode}"


_CRASHES = frozenset(("SIGSEGV", "SIGBUS", "SIGABRT", "SIGFPE", "SIGILL"))


def likely_cause(exitcode: int | None) -> str:
    """What usually ends a worker that way: a crash in native code, the out-of-memory killer,
    or code that ends the process (``os._exit``: a step's ``sys.exit`` is reported as its
    error, ``worker.TaskRunner.run``)."""
    name = _signal_name(exitcode)
    if name is not None:
        if name in _CRASHES:
            return "native code crashed in the step (a decoder, an extension module)"
        if name == "SIGKILL":
            return "the out-of-memory killer or a kill from outside ended it"
        return "a signal ended it"
    return "code in the step ended the process (os._exit, or a library exiting)"


def start_death_error(slot: int, deaths: int, exitcode: int | None,
                      start_method: str = "fork") -> WorkerDiedError:
    """The error of a worker slot whose workers died ``deaths`` times in a row while starting,
    before their "ready" (``worker_init_fn`` or the dataset's setup ends the process: a
    segfault in an import, ``os._exit``, the OOM killer at start-up; under ``spawn`` or
    ``forkserver``, a script without a ``__main__`` guard, which each worker imports). torch
    raises at the first such death; headrace replaces the worker up to
    ``Options(max_worker_restarts)`` times."""
    guard = ("" if start_method == "fork" else
             f"; under the {start_method!r} start method each worker also imports the script "
             "that made the loader, so a script whose training code is not under "
             "`if __name__ == '__main__':` runs it again there and the worker fails (Python's "
             "multiprocessing docs, \"Safe importing of main module\")")
    return worker_start_error(None, (
        f"worker {slot} died {deaths} times in a row while starting, before it ran a sample "
        f"(last {how_it_ended(exitcode)}): worker_init_fn or the dataset's setup ends the worker "
        f"process{guard}"))


def step_name(names: list[str], step: int | None) -> str | None:
    """The name of step position ``step`` (None: unknown)."""
    return names[step] if step is not None and 0 <= step < len(names) else None


def death_error(rec: Rec, hung: tuple[int, int] | None, names: list[str], exitcode: int | None,
                sample_timeout_s: float | None, slot: int) -> StepError | WorkerDiedError:
    """The error of a sample whose worker died ``rec.attempts`` times while running it: a
    ``TimeoutError``-flavoured ``StepError`` naming the step it hung in when ``hung`` (the
    task id and step of a worker killed for ``sample_timeout_s``) is this sample's, else a
    ``WorkerDiedError`` naming the sample, the step its last worker died in
    (``rec.died_in``), the workers, and how the last one ended."""
    if hung is not None and hung[0] == rec.task.tid:
        step = step_name(names, hung[1]) or "?"
        return step_error_for(
            TimeoutError, rec.index, step, "TimeoutError",
            f"the sample ran longer than sample_timeout={sample_timeout_s} s in step {step!r} "
            f"on {rec.attempts} attempt(s); its worker was replaced", "", slot)
    died_in = step_name(names, rec.died_in)
    where = f" in step {died_in!r}" if died_in is not None else ""
    workers = ", ".join(map(str, rec.died_on or (slot,)))
    return WorkerDiedError(
        f"sample index {rec.index} was being processed{where} by a worker that died "
        f"{rec.attempts} times (workers {workers}; the last {how_it_ended(exitcode)}: "
        f"{likely_cause(exitcode)}). Skip it with options=headrace.Options(on_error='skip') "
        "or fix the step.")
