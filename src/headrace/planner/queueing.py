"""How many samples a worker process holds at once, and how long it may keep finished ones.

Every sample costs a fixed price in messages on top of its steps: the training process pickles
and writes its task, the worker reads it, writes the result's message, and the scheduler reads
and handles that (about 0.1-0.2 ms of CPU in all, plus two wake-ups, on the 2-core machine of
docs/benchmarks.md). Against a 5 ms image that is a few percent; against a CIFAR-sized sample
whose steps take 0.1 ms it is most of the work, and torch's DataLoader, which sends one message
per batch, was 4-5x faster there (docs/benchmarks.md, "Small samples").

So when the typical sample is cheap, the scheduler queues more of them on each worker process
and writes them in one message, and the worker sends back what it finished in one message per
``hold_s`` of work instead of one per sample: 1 ms of it for samples of 1-2 ms, 4 ms for
samples under 1 ms, where the price per message is most of the training process's work. Two samples (one running, one queued to hide the
round trip: ``runtime/dispatch.py``'s ``DEPTH``) stay the rule for samples of a few milliseconds, where
sample-level batching and the slow lane need every sample seen as soon as it is done.

Pure functions of measured numbers; tested without processes (``tests/unit/test_queueing.py``).
"""

from __future__ import annotations

import math

from headrace import units

MIN_DEPTH = 2
"""Samples assigned to a worker at once when samples are not cheap: one running, one queued."""
MAX_DEPTH = 128
"""Most samples assigned to one worker process at once."""
QUEUE_S = 0.004
"""Seconds of typical work a worker process is given at once (the queue's depth times the
typical sample time) for samples under ``QUEUE_S / MIN_DEPTH`` (2 ms): about four message
round trips of the training process, so a worker never runs dry while its finished samples
travel and new ones come back."""
HOLD_S = 0.001
"""Seconds of work a worker process may finish before it sends what it finished (when samples
are queued deeper than ``MIN_DEPTH``): a quarter of ``QUEUE_S``, so a refill arrives while
three quarters of the queue are still there."""
CHEAP_S = 0.001
"""Samples typically shorter than this (seconds; CIFAR-sized: 0.1-0.3 ms) share longer
messages: ``CHEAP_QUEUE_S`` and ``CHEAP_HOLD_S`` instead of ``QUEUE_S`` and ``HOLD_S``."""
QUEUE_BYTES = 8 << 20
"""Most bytes of typical samples queued on one worker process at once (``queue_depth``): deep
queues share messages, whose price is per sample, not per byte, and what a worker finishes
waits in its ring until the training process copies it out; a queue of 20 MB samples taking
1.5-2 ms, three at once, kept 120 MB of each worker's 256 MB ring resident (two at once: 40 MB,
``tests/integration/test_ring_span.py``)."""
CHEAP_QUEUE_S = 0.016
"""``QUEUE_S`` for samples under ``CHEAP_S``: four of their holds."""
CHEAP_HOLD_S = 0.004
"""``HOLD_S`` for samples under ``CHEAP_S``: a message carries about 4 ms of their work (15-40
CIFAR-sized samples) instead of 1 ms (2-3 of them, as measured): about 10% less
training-process CPU per CIFAR-sized sample, and 2-4% more samples/s in the bench's two runs
(inside their spread; 8-17% in two noisier one-off A/Bs); tiny samples, whose messages were
already full at 1 ms, level (docs/benchmarks.md, "Small samples"). What
it costs: a finished sample may wait up to 4 ms plus one step before it is sent, where a
batch of such samples takes longer than that to fill."""


def queue_depth(typical_s: float, sample_bytes: int = 0) -> int:
    """Samples to assign to one worker process at once, given the typical (median) seconds of a
    sample's steps: enough to cover ``QUEUE_S`` (``CHEAP_QUEUE_S`` under ``CHEAP_S``), between
    ``MIN_DEPTH`` and ``MAX_DEPTH``, and no more than ``QUEUE_BYTES`` of samples of
    ``sample_bytes`` (a finished sample's payload bytes as last measured; 0: unknown). ``typical_s``
    unknown (nan, inf, 0 or negative): ``MIN_DEPTH``. Under ``CHEAP_S`` the depth is over
    ``QUEUE_S / CHEAP_S`` (4), at or above it at most that, unless bytes cap it: ``hold_s``
    tells the two apart by the depth, and keeps a capped queue's hold within its work."""
    if not math.isfinite(typical_s) or typical_s <= 0:
        return MIN_DEPTH
    queue = CHEAP_QUEUE_S if typical_s < CHEAP_S else QUEUE_S
    depth = min(MAX_DEPTH, math.ceil(queue / typical_s))
    if sample_bytes > 0:
        depth = min(depth, QUEUE_BYTES // sample_bytes)
    return max(MIN_DEPTH, depth)


def describe(typical_s: float, depth: int, shared: int | None, samples: int | None,
             sample_bytes: int = 0) -> str:
    """``explain()``'s line: the typical sample, the depth it gives, and how many of the last
    epoch's ``samples`` came in shared messages (``None``: no epoch yet); ``sample_bytes``:
    as ``queue_depth`` was given it (a queue its bytes capped is said so)."""
    if not math.isfinite(typical_s):
        return (f"messages: one per sample each way, {MIN_DEPTH} samples per worker (the typical "
                "sample time is not measured yet)")
    last = (f"; last epoch {shared} of {samples} samples came in shared messages"
            if shared is not None and samples else "")
    capped = (f"no more than {units.size(QUEUE_BYTES)} of samples of "
              f"{units.size(sample_bytes)} are queued on a worker at once"
              if depth < queue_depth(typical_s) and sample_bytes > 0 else "")
    if depth <= MIN_DEPTH:
        why = capped or (f"samples under {units.duration(QUEUE_S / MIN_DEPTH)} would be "
                         "queued deeper and share messages")
        return (f"messages: one per sample each way, {MIN_DEPTH} samples per worker (typical "
                f"sample {units.duration(typical_s)}: {why}){last}")
    capped = f" ({capped})" if capped else ""
    return (f"messages: typical sample {units.duration(typical_s)}, so worker processes get "
            f"{depth} at once in one message and send what they finish within "
            f"{units.duration(hold_s(depth, typical_s))} together{capped}{last}")


def hold_s(depth: int, typical_s: float = math.nan) -> float:
    """Seconds a worker may keep finished samples before sending them, for a queue of
    ``depth`` (``queue_depth``'s): ``CHEAP_HOLD_S`` for samples under ``CHEAP_S`` (a depth over
    ``QUEUE_S / CHEAP_S``), ``HOLD_S`` for the others queued deeper than ``MIN_DEPTH``, else 0
    (every sample is sent the moment it is done). Where ``QUEUE_BYTES`` capped the depth below
    what ``typical_s`` gives, at most a quarter of the work queued (``depth * typical_s``): a
    hold longer than the queue never came due, and the worker ran dry before it sent (a
    review: 1 MiB samples of 200 µs, 8 queued, 17% fewer samples/s). (``MAX_DEPTH``'s cap
    keeps the tier's hold: samples of microseconds fill a message within it.)"""
    hold = CHEAP_HOLD_S if depth > QUEUE_S / CHEAP_S else HOLD_S if depth > MIN_DEPTH else 0.0
    if depth < queue_depth(typical_s):
        hold = min(hold, depth * typical_s / 4)
    return hold
