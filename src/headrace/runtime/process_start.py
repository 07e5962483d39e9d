"""Starting one worker process and recording it in its pool, as one step that a Ctrl-C cannot
cut in two (NOTE [headrace shutdown] in ``runtime/worker_stop.py``)."""

from __future__ import annotations

from typing import Any

from headrace.runtime.forks import start_process, stop_started
from headrace.runtime.handles import HandOff, Progress, WorkerHandle
from headrace.runtime.ring import Ring
from headrace.runtime.sent_setup import SentSetup
from headrace.runtime.taskpipe import TaskPipe
from headrace.runtime.worker import WorkerSetup


def start_worker_process(ctx: Any, setup: WorkerSetup, handoff: HandOff, progress: Progress,
                         workers: dict[int, WorkerHandle], python_draws: Any = None
                         ) -> WorkerHandle:
    """Start the worker of ``setup.slot`` (multiprocessing context ``ctx``) and record its
    handle in ``workers``, in one ``try``: on any exception in between (a Ctrl-C lands where a
    function starts) the worker is killed and reaped and our pipe ends and its ring closed;
    unrecorded, no shutdown saw it, and it waited on its task pipe until the interpreter
    exited (a bug hunt's find). ``python_draws``: the pool's shared flags of the steps that
    draw from Python's generator (``runtime/python_draws.py``)."""
    reader, writer = ctx.Pipe(duplex=False)
    task_reader, task_writer = ctx.Pipe(duplex=False)
    ring = Ring(ctx)
    slot = setup.slot
    method = ctx.get_start_method()
    shared = (handoff, progress, ring, python_draws)
    if method == "fork":
        args: tuple[Any, ...] = (setup, task_reader, writer, *shared)
    else:  # unpickled by the worker, in one pickle with what it shares (sent_setup.py)
        args = (SentSetup(setup, shared, method), task_reader, writer)
    proc = None
    try:
        tasks = TaskPipe(task_writer)
        proc = start_process(ctx, args, f"headrace-worker-{slot}",
                             parent_ends=(task_writer, reader))
        h = workers[slot] = WorkerHandle(slot, proc, tasks, reader, ring)
        writer.close()  # only the worker writes; EOF on our end then means it died
        task_reader.close()  # only the worker reads
    except BaseException:
        if proc is not None:
            if getattr(workers.get(slot), "process", None) is proc:
                del workers[slot]
            stop_started(proc)
        for conn in (task_writer, reader, writer, task_reader):
            conn.close()
        ring.close()
        raise
    return h
