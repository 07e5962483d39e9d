"""A worker process's messages to the training process: finished samples kept to share a
message (``Outbox``, ``planner/queueing.py``), how a sample's value travels (``RingSender``),
and sending that turns a sample that cannot be sent into that sample's error (``send``,
``unsendable``). Message formats: ``runtime/worker.py``."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
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

    def __init__(self, results: Any, unsent: Callable[[int], None] | None = None) -> None:
        self.results = results
        self.unsent = unsent  # a "done"/"partial" not sent, by its ring end (``send``)
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
            return send(self.results, kept[0], self.unsent)
        try:
            self.results.send(("many", kept))
            return True
        except (BrokenPipeError, EOFError, OSError):
            return False
        except Exception:  # noqa: BLE001 - one unpicklable sample: each on its own, so the
            return all(send(self.results, m, self.unsent) for m in kept)  # error names it


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

    A sample that does not go (its encoding raises, its message does not pickle) becomes an
    error message, which carries no ring end: the training process frees ring space up to the
    end of each message it reads, so the space that sample's arrays took stayed held until a
    later message's end passed it, and a later sample needing it waited forever (one whose
    leaves filled a spawned worker's 16 MiB ring). The space goes back to the writer at once
    instead: on an encoding's exception, and by ``give_back`` (the ``Outbox``'s ``unsent``) for
    the value encoded last; one encoded before a later value is freed by that value's end.
    """

    def __init__(self, writer: RingWriter) -> None:
        self.writer = writer
        self.last = (0, 0)
        """The writer's ``write_pos`` (bytes) before and after the value encoded last."""
        self.encoding = False
        """A value is being encoded: the writer, waiting for space, flushes the outbox."""

    def __call__(self, value: Any) -> tuple[Any, int]:
        start = self.writer.write_pos
        self.encoding = True
        try:
            payload = ring_encode(value, self.writer, encode)
        except BaseException:
            self._back_to(start)
            raise
        finally:
            self.encoding = False
        self.last = (start, self.writer.write_pos)
        return payload, self.writer.write_pos

    def give_back(self, ring_end: int) -> None:
        """The value whose message ends at ``ring_end`` (bytes) was not sent: free its ring
        space if it is the one encoded last (nothing written after it) and no value is being
        encoded now (whose end will free it)."""
        start, end = self.last
        if not self.encoding and ring_end == end == self.writer.write_pos:
            self._back_to(start)

    def _back_to(self, start: int) -> None:
        """Forget what was written from ``start`` on: no message sent holds an end past it."""
        w = self.writer
        w.write_pos = start
        while w.held and w.held[-1][0] > start:
            w.held.pop()
        self.last = (start, start)


def send(conn: Any, msg: Any, unsent: Callable[[int], None] | None = None) -> bool:
    """Send ``msg`` to the training process; False when it is gone. A finished or handed-off
    sample that cannot be sent (it does not pickle, /dev/shm is full) is reported as that
    sample's error instead, so the training loop hears which sample failed and why, after
    ``unsent(ring_end)`` (``RingSender.give_back``: the error frees no ring space)."""
    try:
        conn.send(msg)
        return True
    except (BrokenPipeError, EOFError, OSError):
        return False  # the main process closed our pipe: shutting down
    except Exception as e:  # noqa: BLE001 - e.g. an unpicklable sample, /dev/shm full
        if msg[0] in ("done", "partial"):
            if unsent is not None:
                unsent(msg[-1])
            return send(conn, unsendable(msg[1], e, NOT_PICKLABLE))
        raise


def unsendable(tid: int, e: Exception, why: str) -> tuple[Any, ...]:
    """The error message of task ``tid``, whose value could not be sent because of ``e``
    (raised just now: its traceback goes with it); the training process raises it at step
    'transport' (``errors.TRANSPORT_STEP``), or skips the sample with ``on_error='skip'``.
    ``why``: what the message adds (``NOT_PICKLABLE``, ``NOT_ENCODED``), unless /dev/shm is
    full (``SHM_FULL``)."""
    text = f"the sample could not be sent to the main process: {e}"
    text += SHM_FULL if _looks_like_shm_exhaustion(e) else why
    return ("error", tid, -1, picklable_class(type(e)), qualname(type(e)), text,
            traceback.format_exc(), None)


def _looks_like_shm_exhaustion(e: BaseException) -> bool:
    text = str(e).lower()
    return any(k in text for k in ("no space left", "shm", "shared memory", "unable to write to file"))


def qualname(cls: type) -> str:
    """``cls``'s name as error messages give it: qualified by its module unless builtin."""
    mod = cls.__module__
    return cls.__qualname__ if mod in ("builtins", "__main__") else f"{mod}.{cls.__qualname__}"
