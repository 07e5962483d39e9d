"""The worker process: runs steps on samples it is sent, hands slow ones back.

Messages (tuples, to keep pickling cheap):

* main -> worker, on the worker's task pipe (``runtime/taskpipe.py``): ``Task``, ``Tasks``
  (several, for cheap samples: ``planner/queueing.py``) or ``None`` (exit).
* worker -> main, on the worker's result pipe:
  ``("ready", slot, reseeded)`` once initialised (``reseeded``: the global generators that
  ``worker_init_fn`` seeded, which per-sample seeding overrides), or ``("init_error", slot, cause_type, message, tb, exc_class)``
  (``exc_class``: what was raised, where it pickles, else None);
  ``("done", tid, payload, timings, bytes_in, ring_end)``; ``("partial", tid, next_step, payload,
  timings, bytes_in, drew_at, ring_end)`` when the sample is handed off (timings: ``StepTiming``
  per step run; bytes_in: size of the value a resumed run started from; drew_at: the first step
  so far that drew from a global generator, or None: ``Outcome.drew_at``, for ``Task.drew_at``;
  ring_end: the worker's ring write position after this payload, which the receiver frees up
  to); ``("error", tid, step, exc_class, cause_type, message, tb, attributes)``
  (``attributes``: the exception's own, those that pickle: ``errors.exception_attributes``;
  ``None`` for a sample that could not be sent), with a ninth field for a sample that could
  not be sent (``outbox.unsendable``): the ring end of its message that did not pickle, or
  None where nothing was written;
  ``("many", [message, ...])``: several finished samples' messages, in order (``Outbox``).

See NOTE [headrace shutdown] in ``runtime/worker_stop.py`` for how a worker exits.
"""

from __future__ import annotations

import collections
import functools
import gc
import logging
import multiprocessing.util as mp_util
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from headrace.cache.epoch_client import for_epoch
from headrace.cache.running import run_cached
from headrace.errors import exception_attributes, message_of, picklable_class
from headrace.pipeline import Pipeline
from headrace.pipeline.runner import Outcome, SampleRunner
from headrace.planner.timeout import worth_moving
from headrace.profiler import sizes
from headrace.profiler.runqueue import run_queue_s
from headrace.runtime import kept_said
from headrace.runtime.faithful import why_it_stays
from headrace.runtime.gilprobe import start_probe
from headrace.runtime.native_threads import limit_in_worker
from headrace.runtime.order_watch import guard_for
from headrace.runtime.outbox import NOT_ENCODED, Outbox, RingSender, qualname, send, unsendable
from headrace.runtime.parent import exit_when_parent_gone, parent_gone
from headrace.runtime.python_draws import WorkerFlags
from headrace.runtime.ring import RingWriter
from headrace.runtime.sent_setup import ReceivedSetup, SetupNotRebuilt
from headrace.runtime.state_watch import StateWatch
from headrace.runtime.state_watch import note as note_state
from headrace.runtime.torch_worker import init_as_torch_worker
from headrace.runtime.transport import decode

MEASURE_ALL = 64
"""A worker measures output sizes on its first this many samples..."""
MEASURE_EVERY = 8
"""...then on one in this many (sizes cost a few µs per step; times are always measured)."""
POLL_S = 0.5
"""How often a waiting worker checks that its parent is still alive (seconds)."""

log = logging.getLogger("headrace")


class Task(NamedTuple):
    """One unit of work: run steps ``start..`` of sample ``index``."""

    tid: int
    sample: int  # dataset index (``index`` would shadow tuple.index)
    start: int
    payload: Any  # encoded partial value when start > 0
    base_seed: int
    epoch: int
    may_hand_off: bool
    draw: int = 0  # times the index came earlier this epoch (runtime/draws.py): in its seed
    drew_at: int | None = None  # a resumed sample's first step that drew from a global
    # generator before its hand-off: its cache stores no unseeded form (cache/running.py)


class Tasks(NamedTuple):
    """Several tasks in one message (cheap samples, ``planner/queueing.py``): run in order;
    finished samples may be kept for up to ``hold_s`` seconds and sent in one message."""

    tasks: list[tuple[Any, ...]]  # each a Task's fields (``Task._make`` rebuilds it)
    hold_s: float


class WorkerSetup(NamedTuple):
    """What a worker needs at start (pickled once per worker)."""

    slot: int
    num_workers: int
    base_seed: int
    pipeline: Pipeline
    dataset: Any  # what get_worker_info().dataset returns
    worker_init_fn: Any
    parent_pid: int
    profile: bool | str  # measure bytes and type changes per step ("all": on every sample)
    cache: Any = None  # headrace.cache.client.CacheClient, or None
    probe_gil: bool = False  # run the GIL probe (runtime/gilprobe.py): executor="auto"
    blas_threads: int | None = None  # native pools' threads (runtime/native_threads.py)


def forked_main(collecting: bool, parent_ends: tuple[Any, ...], *args: Any) -> None:
    """Entry point of a forked worker: what it inherited leaves its collections, then
    ``worker_main``. The pool forks with the collector off (``pool.py``), so no collection ran
    in between; ``collecting``: whether the training process's collector was on.
    ``parent_ends``: the training process's ends of this worker's own pipes (connections),
    closed here, so that this worker reads EOF once the training process closes them (a
    worker whose start an exception cut short, unrecorded: ``process_start.py``)."""
    for conn in parent_ends:
        conn.close()
    gc.freeze()
    if collecting:
        gc.enable()
    worker_main(*args)


def worker_main(sent: WorkerSetup | ReceivedSetup, tasks: Any, results: Any, *shared: Any
                ) -> None:
    """Entry point of a worker process. ``sent``: its ``WorkerSetup``; a spawned worker's
    arrives pickled, with ``shared`` inside it, and is unpickled here, so that what cannot be
    is reported (``runtime/sent_setup.py``).

    ``shared``: ``(handoff, progress, ring, python_draws)``, what the worker shares with its
    pool. ``handoff``: shared values (``handles.HandOff``): the timeout in seconds and, per
    step position, the expected seconds of the steps from there to the end (read between
    steps). ``progress``: shared arrays (``handles.Progress``) where the worker writes, per
    slot, the tid it runs (−1: idle), when it started (``time.monotonic()``) and the step it is
    in, so the main process knows what a dead or hung worker held. ``ring``: its
    ``ring.Ring``. ``python_draws``: the pool's shared flags of the steps drawing from Python's
    generator (``runtime/python_draws.py``), or None.
    """
    slot = sent.slot
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    setup: WorkerSetup
    if isinstance(sent, ReceivedSetup):
        try:
            setup, shared = sent.load()
        except SetupNotRebuilt as e:
            send(results, ("init_error", slot, qualname(type(e.cause)), str(e),
                           "".join(traceback.format_exception(e.cause)),
                           picklable_class(type(e.cause))))
            return
    else:
        setup = sent
    handoff, progress, ring, python_draws = shared
    backend = getattr(setup.cache, "backend", None)
    owner_gone = getattr(backend, "owner_gone", None)
    # also while in worker_init_fn or a step; from its own thread, the files only
    exit_when_parent_gone(setup.parent_pid, getattr(backend, "remove_files", None))
    try:
        torch.set_num_threads(1)
        if setup.blas_threads is not None:  # before worker_init_fn, which may change it
            limit_in_worker(setup.blas_threads)
        reseeded = init_as_torch_worker(setup, progress)
        runner = TaskRunner(setup, handoff, progress, python_draws=python_draws)
        writer = RingWriter(ring, setup.parent_pid)
        if setup.probe_gil:
            start_probe(progress, slot)
    except Exception as e:  # noqa: BLE001 - reported to the main process
        send(results, ("init_error", slot, qualname(type(e)), message_of(e),
                       traceback.format_exc(),
                       picklable_class(type(e))))
        return
    send(results, ("ready", slot, reseeded))
    if owner_gone is not None:  # runs as this process exits (multiprocessing's finalisers)
        mp_util.Finalize(None, _if_orphaned, args=(setup.parent_pid, owner_gone), exitpriority=0)

    to_ring = RingSender(writer)
    outbox = Outbox(results)
    writer.before_wait = outbox.flush  # held samples' ring space is freed once they are sent
    set_step = runner.on_step

    def on_step(step: int) -> None:  # kept samples do not wait through a long step
        set_step(step)
        outbox.flush_if_due()

    runner.on_step = on_step
    queued: collections.deque[Task] = collections.deque()
    while True:
        if not queued:
            try:
                if not tasks.poll(0):  # about to wait: what it finished goes first (with
                    if not outbox.flush():  # tasks already waiting, the hold decides instead)
                        return
                    while not tasks.poll(POLL_S):
                        if parent_gone(setup.parent_pid):
                            return  # the training process is gone
                msg = tasks.recv()
            except (EOFError, OSError):
                return  # the training process closed our pipe: shutting down
            if msg is None:  # retired (or the pool closes): what it finished goes first
                outbox.flush()
                return
            if type(msg) is Tasks:
                queued.extend(map(Task._make, msg.tasks))
                outbox.hold_s = msg.hold_s
            else:
                queued.append(msg)
                outbox.hold_s = 0.0
        task = queued.popleft()
        if runner.revoked(task):
            continue
        started = time.monotonic()
        out = runner.run(task, decode(task.payload) if task.start > 0 else None)
        if not outbox.add(runner.message(task.tid, out, to_ring), started):
            return


class TaskRunner:
    """Runs tasks in one worker, process or thread (``runtime/threadworker.py``).

    Keeps the worker's ``progress`` slot current (the tid, start time and step the main
    process reads), measures output sizes on the first ``MEASURE_ALL`` runs and then one in
    ``MEASURE_EVERY`` (in a pool that probes for ``executor="auto"``, also whether a step drew
    from the global random generators, on every run: ``Progress.global_draw``, and whether
    the source or a step object gained or rebound an attribute: ``runtime/state_watch.py``),
    and asks the hand-off rule between steps: over the shared timeout (``handoff``: the pool's
    ``HandOff``), and enough typical work left for a move to pay. A sample whose partial value
    would not arrive as it is (it does not pickle, or two of its parts share memory:
    ``runtime/faithful.py``) is not handed off: its worker finishes it. ``python_draws``:
    the pool's shared flags of the steps known to draw from Python's generator, read at the
    start and at each new epoch, set when this worker flags a step (``runtime/python_draws.py``).
    """

    def __init__(
        self, setup: WorkerSetup, handoff: Any, progress: Any, reseed_globals: bool = True,
        python_draws: Any = None,
    ) -> None:
        measure = sizes.measure if setup.profile else None
        watch: Callable[[int], None] | None = None
        if setup.probe_gil:  # executor="auto": threads would not re-seed the global generators
            draws, slot = progress.global_draw, setup.slot

            def note_draw(step: int) -> None:
                if not draws[slot]:
                    draws[slot] = step + 1

            watch = note_draw
        # executor="auto": threads would share what the source and steps keep per worker
        self.state_watch = StateWatch(setup.pipeline) if setup.probe_gil else None
        self.learned = WorkerFlags(python_draws) if python_draws is not None else None
        flags, tell = (self.learned.flags, self.learned.tell) if self.learned else (None, None)
        self.epoch = -1  # of the last task run: a new one refreshes ``learned``
        broke, slot = progress.order_broke, setup.slot
        guard = guard_for(setup.pipeline, lambda step, _why: broke.__setitem__(slot, step + 1))
        self.measured = SampleRunner(setup.pipeline, measure, reseed_globals, run_queue_s,
                                     on_global_draw=watch, python_draws=flags,
                                     on_python_draw=tell, guard=guard)
        # a probing pool watches every sample it runs (4 µs a step), not only the first ones:
        # a step drawing only for later samples (indices past 200) moved to threads unseen
        self.plain = SampleRunner(setup.pipeline, None, reseed_globals, on_global_draw=watch,
                                  python_draws=self.measured.python_draws, on_python_draw=tell,
                                  guard=guard)
        self.slot = setup.slot
        self.cache = setup.cache
        self.progress = progress
        self.runs = 0
        self.measure_all = setup.profile == "all"  # near storage: every sample's sizes
        self.pipeline_names = setup.pipeline.step_names
        limit, remaining = handoff.timeout, handoff.remaining

        def hand_off(next_step: int, spent: float) -> bool:
            return worth_moving(spent, limit.value, remaining[next_step])

        self.hand_off = hand_off
        self.watch_draws = False
        """Watch a run that may be handed off for draws from the global generators also with
        no cache here (a remote worker: the local workers that finish it store its forms)."""
        self.on_step: Callable[[int], None] = functools.partial(progress.step.__setitem__, setup.slot)

    def revoked(self, task: Task) -> bool:
        """The task moved to an idle worker while it waited here (behind a slow sample, or
        while this worker started)."""
        return bool(self.progress.is_revoked(self.slot, task.tid))

    def run(self, task: Task, value: Any) -> Outcome:
        """Run ``task`` (from its partial ``value`` when it resumes at a later step). A
        partial outcome is returned only for a value that travels faithfully; any other goes
        on here to the end, with the timings of both runs, as the worker it would have been
        handed to runs it (same seeds, same cache forms)."""
        slot, progress = self.slot, self.progress
        progress.started[slot] = time.monotonic()
        progress.step[slot] = task.start
        progress.tid[slot] = task.tid
        self.runs += 1
        if task.epoch != self.epoch and self.learned is not None:  # (persistent workers) what
            self.epoch = task.epoch  # the pool's other workers flagged in the last epochs
            self.learned.refresh()
        self.cache = for_epoch(self.cache)  # (persistent workers) the epoch's cache plan
        measured = (self.runs <= MEASURE_ALL or self.runs % MEASURE_EVERY == 0
                    or self.measure_all)
        run = (self.measured if measured else self.plain).run
        try:
            return self._run(task, value, run)
        except (SystemExit, KeyboardInterrupt) as e:
            # a step's own (a worker ignores SIGINT, and its shutdown sends no signal that
            # raises): the sample's error with its traceback, as an ``Exception`` is; it ended
            # the worker, which was taken for a crash and lost both (docs/reliability.md)
            return Outcome(None, None, [], (progress.step[slot], e, traceback.format_exc()))
        finally:
            seen = self.state_watch.check() if self.state_watch is not None else None
            if seen is not None:
                note_state(progress, slot, *seen)

    def _run(self, task: Task, value: Any, run: Callable[..., Outcome]) -> Outcome:
        slot = self.slot
        out = run_cached(self.cache, run, task.sample, task.start, value, task.base_seed,
                         task.epoch, slot, task.drew_at, self.watch_draws,
                         hand_off=self.hand_off if task.may_hand_off else None,
                         on_step=self.on_step, draw=task.draw)
        if out.next_step is None or out.error is not None:
            return out
        why = why_it_stays(out.value)
        if why is None:
            return out
        # kept: the worker goes on as the one it was handed to would have (runtime/faithful.py)
        _say_kept(self.progress, out.next_step - 1, self.pipeline_names[out.next_step - 1], why)
        rest = run_cached(self.cache, run, task.sample, out.next_step, out.value,
                          task.base_seed, task.epoch, slot, out.drew_at, on_step=self.on_step,
                          draw=task.draw)
        return Outcome(rest.value, rest.next_step, out.timings + rest.timings, rest.error,
                       out.bytes_in, rest.drew_at)

    def message(
        self, tid: int, out: Outcome, send_value: Callable[[Any], tuple[Any, int | None]]
    ) -> tuple[Any, ...]:
        """The message for ``out`` (see the module docstring); marks the slot idle after it.

        ``send_value(value) -> (payload, ring_end)``: how the finished or partial value travels;
        where it raises, the sample's error (``outbox.unsendable``): the worker goes on.
        """
        msg: tuple[Any, ...]
        if out.error is not None:
            step, exc, tb = out.error
            msg = ("error", tid, step, picklable_class(type(exc)), qualname(type(exc)),
                   message_of(exc), tb,
                   exception_attributes(exc, picklable=True))
        else:
            try:
                payload, ring_end = send_value(out.value)
            except Exception as e:  # noqa: BLE001 - that sample's error: it ended the worker,
                # whose samples re-ran on the next one, which ended the same way
                self.progress.tid[self.slot] = -1
                return unsendable(tid, e, NOT_ENCODED)
            if out.next_step is not None:
                msg = ("partial", tid, out.next_step, payload, out.timings, out.bytes_in,
                       out.drew_at, ring_end)
            else:
                msg = ("done", tid, payload, out.timings, out.bytes_in, ring_end)
        self.progress.tid[self.slot] = -1
        return msg


_kept_said: set[str] = set()
"""Steps after which this process said it kept a sample, where its ``progress`` has no shared
flags (a remote worker's)."""


def _say_kept(progress: Any, position: int, step: str, why: str) -> None:
    """Warn, once per step (``runtime/kept_said.py``: over a loader's workers and epochs; a
    remote worker: once per process), that a sample was not handed off after ``step`` (over
    the timeout, or at a remote worker's split point) because of ``why``
    (``runtime/faithful.py``), and its worker finished it."""
    flags = getattr(progress, "kept", None)
    if flags is not None and position < len(flags):
        if not kept_said.first(flags, position):
            return
    elif step in _kept_said:
        return
    else:
        _kept_said.add(step)
    log.warning("headrace: a sample was not handed off to another worker after step %r: %s. "
                "Its worker finished it, as it would without hand-off (said once per step; "
                "docs/design.md, \"What cannot be handed off\")", step, why)


def _if_orphaned(parent_pid: int, clean_up: Callable[[], Any]) -> None:
    """``clean_up()`` if the training process is gone (every worker sees it within
    ``POLL_S`` and exits; a second removal finds nothing)."""
    if parent_gone(parent_pid):
        clean_up()
