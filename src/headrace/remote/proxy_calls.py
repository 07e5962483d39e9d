"""What a remote worker's proxy thread does with one task and one result, in the training
process (no Ray import: the actor handle's ``run.remote`` is the one call made): ``submit``
loads the sample here where the source is not reachable remotely (checked: a value that would
not arrive as it is, or a load that drew from a global generator, goes back to the local
workers) and calls the actor; ``local_message`` makes the actor's answer a local worker
thread's message. The proxy's loop is ``remote/ray_backend.py``'s."""

from __future__ import annotations

from typing import Any

from headrace.errors import exception_attributes, message_of, picklable_class
from headrace.pipeline.draw_marks import load_mark
from headrace.pipeline.runner import SampleRunner
from headrace.remote.payload import pack, unpack
from headrace.remote.proxy_options import LOAD_DREW, NOT_LOADED, ProxyOptions
from headrace.runtime.faithful import why_it_stays
from headrace.runtime.outbox import qualname
from headrace.runtime.transport import decode, encode
from headrace.runtime.worker import Task


def submit(actor: Any, task: Task, opts: ProxyOptions,
            local: SampleRunner | None) -> tuple[Any, ...]:
    """Call the actor for ``task``: ``("ref", object ref, local timings, the step its remote
    part ends at)``, or ``("msg",
    message)`` when nothing is left to run remotely (a local load failed, or was all; the
    split point moved before the task's step since it was dispatched: handed back as it is,
    for the local workers).

    A value loaded here that would not reach the actor as it is (``runtime/faithful.py``: it
    does not pickle, or two of its parts share memory, which ``pack`` and ``encode`` would
    carry as separate copies) is shipped nowhere: the sample goes back at step 0, for a local
    worker to load again and run whole (``LoadLocally``; its load here is not timed in the
    profile). The check runs on every sample loaded here, all of which cross: 2 to 9 µs
    (bytes, an array, a dict of a tensor and metadata), against about 1 ms for the call to
    the actor that it precedes (docs/design.md).

    So does a sample whose load drew from a global random generator (``load_mark`` around
    it): here they are the training loop's, not seeded per sample (nor seeded and restored:
    the training loop may draw meanwhile, in its thread), and the partial value would travel
    without the ``drew_at`` that keeps the cache from storing its later forms. After
    ``DRAWN_IN_A_ROW`` such loads in a row the loader's proxies load no more
    (``LoadDraws.stopped``, for the loader's life): the remote workers are then given no
    sample that starts at the load, and one queued here before goes back unloaded."""
    value = None
    before: list[Any] = []
    stop = opts.stop_for(task.sample)
    if task.start > 0 and stop <= task.start:
        return ("msg", ("partial", task.tid, task.start, task.payload, [], 0, task.drew_at,
                        None))
    if task.start > 0:  # a slow-lane sample (over the timeout, before the split) resumed here
        value = decode(task.payload) if opts.processes else task.payload
        if opts.on_resumed is not None:
            opts.on_resumed()
    elif local is not None:  # the source is not reachable remotely: load here
        if opts.loads_stopped:  # queued before the loads stopped: load none here
            return opts.hand_back(task, NOT_LOADED)
        mark = load_mark()
        out = local.run(task.sample, 0, None, task.base_seed, task.epoch,
                        hand_off=lambda _next, _spent: True, draw=task.draw)
        drew = load_mark() != mark
        opts.draws.loaded(drew)
        if drew:  # unseeded here (its error, too, may be the draw's): a local worker loads it
            return opts.hand_back(task, LOAD_DREW)
        if out.error is not None:
            step, exc, tb = out.error
            return ("msg", ("error", task.tid, step, picklable_class(type(exc)),
                            qualname(type(exc)), message_of(exc), tb,
                            exception_attributes(exc, picklable=True)))
        if out.next_step is None:  # the load is the whole pipeline
            return ("msg", ("done", task.tid, out.value, out.timings, 0, None))
        why = why_it_stays(out.value)  # every sample loaded here crosses (the cost: above)
        if why is not None:  # it would not arrive as it is: a local worker runs it whole
            return opts.hand_back(task, why)
        value, before = out.value, out.timings
        task = task._replace(start=out.next_step)
        if stop <= task.start:  # the split is at the load: nothing to run remotely
            return ("msg", ("partial", task.tid, task.start,
                            encode(value) if opts.processes else value, before, 0, None, None))
    handoff = None
    if task.may_hand_off and opts.handoff is not None:  # the local workers' rule, now
        h = opts.handoff
        handoff = (float(h.timeout.value), tuple(float(r) for r in h.remaining))
    ref = actor.run.remote(task._replace(payload=None), stop,
                           pack(value) if value is not None else None, handoff)
    return ("ref", ref, before, stop)


def local_message(msg: tuple[Any, ...], before: list[Any], opts: ProxyOptions) -> tuple[Any, ...]:
    """The actor's message as a local worker thread's: values unpacked (a partial one encoded
    for worker processes), timings of a local load in front."""
    kind = msg[0]
    if kind == "done":
        _, tid, payload, timings, bytes_in, _ = msg
        return ("done", tid, unpack(payload), before + list(timings), bytes_in, None)
    if kind == "partial":
        _, tid, next_step, payload, timings, bytes_in, drew_at, _ = msg
        value = unpack(payload)
        return ("partial", tid, next_step, encode(value) if opts.processes else value,
                before + list(timings), bytes_in, drew_at, None)
    return msg
