"""A worker process's messages to the training process: finished samples kept to share a
message (``Outbox``, ``planner/queueing.py``), how a sample's value travels (``RingSender``),
and sending that turns a sample that cannot be sent into that sample's error (``send``,
``unsendable``). Message formats: ``runtime/worker.py``."""

from __future__ import annotations

import time
import traceback
from typing import Any

from headrace.errors import picklable_class
from headrace.runtime.ring import RingWriter
from headrace.runtime.ring import encode as ring_encode
from headrace.runtime.transport import encode


class Outbox:
    """A worker process's finished samples not sent yet (``planner/queueing.py``).

    ``add`` keeps a "done" message while the first one kept, were one more sample as long as
    this one run first, would still be younger than ``hold_s`` seconds (a sample longer than
    ``hold_s`` is never kept), and sends everything kept, in one ``("many", [message, ...])``,
    once that is no longer so; other messages (a hand-off, an error) and ``hold_s == 0`` send at
    once, with what was kept. The worker's loop flushes before it waits for tasks, its ring
    writer before it waits for ring space, and the step hook before each step once the first
    kept is older than ``hold_s``: nothing kept waits on the training process, and nothing
    waits more than ``hold_s`` plus one step.
    """

    def __init__(self, results: Any) -> None:
        self.results = results
        self.kept: list[tuple[Any, ...]] = []
        self.since = 0.0  # time.monotonic() when the first kept message was added
        self.hold_s = 0.0  # seconds of work a finished sample may wait (the task message's)

    def add(self, msg: tuple[Any, ...], started: float) -> bool:
        """Keep or send ``msg``, the result of a sample started at ``started``
        (``time.monotonic()``); False when the training process is gone."""
        now = time.monotonic()
        if not self.kept:
            self.since = now
        self.kept.append(msg)
        if msg[0] == "done" and (now - self.since) + (now - started) < self.hold_s:
            return True
        return self.flush()

    def flush_if_due(self) -> None:
        """Send what was kept once the first kept is older than ``hold_s`` (before a step)."""
        if self.kept and time.monotonic() - self.since >= self.hold_s:
            self.flush()

    def flush(self) -> bool:
        """Send every kept message; False when the training process is gone."""
        kept, self.kept = self.kept, []
        if not kept:
            return True
        if len(kept) == 1:
            return send(self.results, kept[0])
        try:
            self.results.send(("many", kept))
            return True
        except (BrokenPipeError, EOFError, OSError):
            return False
        except Exception:  # noqa: BLE001 - one unpicklable sample: each on its own, so the
            return all(send(self.results, m) for m in kept)  # error names that sample


SHM_FULL = (
    ". Shared memory (/dev/shm) is exhausted: free it, give the container more "
    "(docker --shm-size), or lower batch_size, prefetch_factor or Options(max_in_flight=...)"
)
"""What a sample's error adds when /dev/shm is full."""

NOT_PICKLABLE = (
    ". headrace collates batches in the training process, so every sample crosses from its "
    "worker process on its own and must pickle (a slow one's value between two steps is not "
    "handed off where it does not); torch's workers collate first and pickle the batch, so "
    "there a collate_fn may drop what does not pickle. Return values that pickle from "
    "__getitem__ and the steps, or run the workers as threads of the training process, "
    "where nothing is pickled: options=headrace.Options(executor='threads') (README, "
    "Differences from torch's DataLoader: \"Batches collated in the training process\")"
)
"""What a sample's error adds when it cannot be sent otherwise (it does not pickle). Never
``on_error='skip'``: every sample of such a dataset fails alike, and the epoch delivered
nothing."""

NOT_ENCODED = (
    ". headrace sends each finished sample from its worker process on its own, rebuilding its "
    "dicts, lists, tuples and named tuples around its arrays and copying those into shared "
    "memory, and this value would not be encoded for that (a named tuple that does not rebuild "
    "from its fields, a leaf that does not copy); torch's workers collate first and pickle the "
    "batch. Return values made of plain containers and arrays from __getitem__ and the steps, "
    "or run the workers as threads of the training process, where nothing is sent: "
    "options=headrace.Options(executor='threads')"
)
"""What a sample's error adds when encoding its value for the trip failed (``RingSender``,
``transport.encode``): the sample fails, its worker goes on."""


class RingSender:
    """How a worker process's finished or partial value travels: ``sender(value) -> (payload,
    ring_end)``, its large arrays copied into the worker's ring, the rest
    ``transport.encode``-d (``TaskRunner.message``'s ``send_value``).

    A value whose encoding raises leaves nothing in the ring: what it wrote is forgotten at
    once (no message holds an end past its start), and the sample's error message follows. A
    message that does not pickle (``send``) becomes an error message carrying that message's
    ring end, which the training process frees up to as for the message itself: without it,
    the space that sample's arrays took stayed held until a later message's end passed it, and
    a later sample needing it waited for ever (one whose leaves filled a spawned worker's 16
    MiB ring). Rewinding the writer for a message that did not go, instead, missed the orders
    in which another value was written after it (a review).
    """

    def __init__(self, writer: RingWriter) -> None:
        self.writer = writer

    def __call__(self, value: Any) -> tuple[Any, int]:
        w = self.writer
        start = w.write_pos
        try:
            payload = ring_encode(value, w, encode)
        except BaseException:
            w.write_pos = start  # forget what it wrote: no message sent holds an end past it
            while w.held and w.held[-1][0] > start:
                w.held.pop()
            raise
        return payload, w.write_pos


def send(conn: Any, msg: Any) -> bool:
    """Send ``msg`` to the training process; False when it is gone. A finished or handed-off
    sample that cannot be sent (it does not pickle, /dev/shm is full) is reported as that
    sample's error instead, so the training loop hears which sample failed and why; the error
    carries the message's ring end, which frees the sample's ring space (:class:`RingSender`)."""
    try:
        conn.send(msg)
        return True
    except (BrokenPipeError, EOFError, OSError):
        return False  # the main process closed our pipe: shutting down
    except Exception as e:  # noqa: BLE001 - e.g. an unpicklable sample, /dev/shm full
        if msg[0] in ("done", "partial"):
            return send(conn, unsendable(msg[1], e, NOT_PICKLABLE, msg[-1]))
        raise


def unsendable(tid: int, e: Exception, why: str,
               ring_end: int | None = None) -> tuple[Any, ...]:
    """The error message of task ``tid``, whose value could not be sent because of ``e``
    (raised just now: its traceback goes with it); the training process raises it at step
    'transport' (``errors.TRANSPORT_STEP``), or skips the sample with ``on_error='skip'``.
    ``why``: what the message adds (``NOT_PICKLABLE``, ``NOT_ENCODED``), unless /dev/shm is
    full (``SHM_FULL``). ``ring_end``: the end of the unsent message's ring space, freed by
    the training process (None: it wrote none)."""
    text = f"the sample could not be sent to the main process: {e}"
    text += SHM_FULL if _looks_like_shm_exhaustion(e) else why
    return ("error", tid, -1, picklable_class(type(e)), qualname(type(e)), text,
            traceback.format_exc(), None, ring_end)


def _looks_like_shm_exhaustion(e: BaseException) -> bool:
    text = str(e).lower()
    return any(k in text for k in ("no space left", "shm", "shared memory", "unable to write to file"))


def qualname(cls: type) -> str:
    """``cls``'s name as error messages give it: qualified by its module unless builtin."""
    mod = cls.__module__
    return cls.__qualname__ if mod in ("builtins", "__main__") else f"{mod}.{cls.__qualname__}"
