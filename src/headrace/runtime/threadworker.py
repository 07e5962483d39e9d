"""Worker threads: the pipeline run by threads of the training process.

``Options(executor="threads")``. A worker process must move every finished sample to the
training process: a copy into its ring, a result message, the scheduler's copy out, plus the
per-step re-seeding of the global generators. On the CPU-bound image workloads that is about
0.6 ms of worker CPU per ~5 ms sample and ~0.35 ms of training-process CPU (docs/benchmarks.md),
all of it competing with the steps for the same cores. A thread hands over the object it
produced: no copy, no pickling, no ring. It pays off when the steps spend their time in code
that releases the GIL (image decoding and resizing in Pillow or OpenCV, NumPy on large arrays,
I/O, sleeps); steps that run Python bytecode most of the time serialise on the GIL, and so
does the training loop's own Python, which shares it with them.

Each thread stands behind the same ``handles.WorkerHandle`` as a process, so the scheduler runs
unchanged: :class:`ThreadTasks` takes the task pipe's place, :class:`ThreadResults` the result
pipe's, and :class:`ThreadRun` the process's (its sentinel becomes readable when the thread
ends). Once the epoch's scheduler watches a thread, the thread hands each result to it directly
(``Scheduler.deliver``, under the scheduler's lock, in the worker thread): no pipe write, no
wake-up of the scheduler thread, no GIL hand-over per sample (imagenet: 7% shorter epochs than
through the pipe, measured in one interleaved run). Before that, and between epochs, messages
wait in a deque with one byte per message on a pipe the scheduler's selector watches.

What differs from processes, by necessity (the loader refuses the options that need processes):

* the global generators (``random``, NumPy's, torch's) are shared by every thread and are not
  re-seeded per step: steps must draw from the ``rng`` they receive to be deterministic. The
  first 64 samples of each thread have the generators' states compared around each step
  (``draw_marks.draw_mark``, about 3 µs a step), and a step seen changing them on most of its
  runs gets a ``UserWarning`` (``runtime/thread_draws.py``: once per step object and process,
  at the line that started the thread, the script's ``for`` or ``iter()``);
* ``get_worker_info()`` returns ``None`` and there is no ``worker_init_fn``;
* a thread cannot be killed: there is no ``sample_timeout_s``, and at shutdown a thread still in
  a step after the pool's grace period (0.5 s for all workers; none when one of the pool's own
  threads shuts it down) is abandoned: it is a daemon thread, finishes its sample and exits;
* torch's intra-op thread pool and OpenBLAS's are the training process's own (a worker process
  limits its own to one thread): a multithreaded op (a large matmul or dot, a float32 sum) can
  end in other last bits than in a worker process (docs/design.md, "Worker processes run
  native thread pools with one thread");
* objects are shared, not copied: the dataset and the step objects are the same for every
  thread (a file handle opened lazily in ``__getitem__`` is one handle for all of them), and
  with a ``collate_fn`` of your own (or ``batch_size=None``) you receive the very objects the
  steps made, so a dataset that returns cached objects, or steps that change their input in
  place, change what you already hold. torch's default collation copies into the batch, and a
  resumed slow-lane sample runs on its own copy of its partial value;
* with ``num_workers="auto"``, time a step waits for the GIL counts as idle CPU for the scaler.
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from headrace import user_frame
from headrace.errors import message_of
from headrace.pipeline.runner import Outcome
from headrace.runtime.outbox import qualname
from headrace.runtime.thread_draws import WATCH_RUNS, DrawWatch, Place
from headrace.runtime.worker import TaskRunner, WorkerSetup

log = logging.getLogger("headrace")


class ThreadTasks:
    """The task pipe's counterpart: ``send`` never blocks, the thread ``get``s in order."""

    pending = False  # nothing ever waits in an outbox: a queue has no capacity limit

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False

    def send(self, obj: Any) -> None:
        """Queue a ``Task`` (or ``None``: exit). Raises OSError once closed, like a closed pipe."""
        if self._closed:
            raise OSError("the worker thread's task queue is closed")
        self._q.put(obj)

    def get(self) -> Any:
        """The next task, waiting for one (``close`` always queues a ``None``)."""
        return self._q.get()

    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self) -> bool:
        return True  # nothing waits (``pending`` is always False)

    def fileno(self) -> int:
        raise OSError("a worker thread's task queue has no descriptor (it never fills up)")

    def close(self) -> None:
        self._closed = True
        self._q.put(None)  # wakes a waiting thread: it exits


class ThreadResults:
    """The result pipe's counterpart: messages go to ``sink`` when it takes them, else into a
    deque, with one byte per message on a pipe, so that the scheduler's selector sees them and
    ``recv`` is called once per message."""

    def __init__(self) -> None:
        self.sink: Callable[[Any], bool] | None = None
        """Set by the running epoch's scheduler: handles a message in the sending thread
        (``Scheduler.deliver``); when unset or refusing, the message waits here."""
        self._msgs: collections.deque[Any] = collections.deque()
        self._r, self._w = os.pipe()
        self._lock = threading.Lock()  # send vs close: never write to a closed (reused) number
        self._closed = False

    def fileno(self) -> int:
        return self._r

    def send(self, msg: Any) -> bool:
        """Post ``msg``; False once closed (the pool is shutting down)."""
        sink = self.sink
        if sink is not None and sink(msg):
            return True
        with self._lock:
            if self._closed:
                return False
            self._msgs.append(msg)
            os.write(self._w, b"\0")  # the pipe holds far more bytes than samples in flight
            return True

    def recv(self) -> Any:
        """The oldest message (its byte is ready: the selector said so). EOFError once closed."""
        if self._closed or not os.read(self._r, 1):
            raise EOFError
        return self._msgs.popleft()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._r, self._w):
                os.close(fd)


_here = threading.local()


def current_run() -> ThreadRun | None:
    """The :class:`ThreadRun` of the calling worker thread (``None`` in any other thread)."""
    return getattr(_here, "run", None)


class ThreadRun:
    """A worker thread behind the part of ``multiprocessing.Process``'s interface the pool and
    the scheduler use. ``sentinel``: a descriptor readable once the thread has ended."""

    pid = None  # no process of its own (psutil would otherwise measure the training process)

    def __init__(self, target: Callable[..., None], args: tuple[Any, ...], name: str) -> None:
        self._target = target
        self._args = args
        self._sentinel_r, self._sentinel_w = os.pipe()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._given_up = False
        self._closed = False
        self.exitcode: int | None = None
        self.place = _user_place()
        """The user's line that started this thread (warnings from it point there), or None."""

    def start(self) -> None:
        self._thread.start()

    def _main(self) -> None:
        _here.run = self
        try:
            self._target(*self._args)
            self.exitcode = 0
        except BaseException:  # noqa: BLE001 - a bug in the worker loop: the scheduler re-runs
            log.error("headrace worker thread %s failed:\n%s", self._thread.name, traceback.format_exc())
            self.exitcode = 1
        finally:
            os.close(self._sentinel_w)  # EOF: the sentinel becomes readable

    @property
    def sentinel(self) -> int:
        return self._sentinel_r

    @property
    def name(self) -> str:
        return self._thread.name

    def is_alive(self) -> bool:
        """False once the thread's body returned (its sentinel is readable from then on)."""
        return self.exitcode is None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread; once given up on (``terminate``/``kill``), or from the thread
        itself (a shutdown it triggered, e.g. by finalising an epoch), not at all."""
        if self._thread is threading.current_thread():
            return
        self._thread.join(0.0 if self._given_up else timeout)

    def terminate(self) -> None:
        """Nothing can stop a thread inside a step: give up on it; it is abandoned (a daemon
        thread) and exits after its current sample (its task queue is closed). Said in a
        warning."""
        if self._thread.is_alive() and not self._given_up:
            log.warning("headrace worker thread %s is still in a step at shutdown; abandoned",
                        self._thread.name)
        self.give_up()

    kill = terminate

    def give_up(self) -> None:
        """Stop waiting for the thread, without a warning: it exits on its own (its pool is
        shut down from one of its own threads, which cannot wait for the others: they may be
        waiting for the scheduler's lock that thread holds)."""
        self._given_up = True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._sentinel_r)


def thread_main(
    setup: WorkerSetup, tasks: ThreadTasks, results: ThreadResults, handoff: Any, progress: Any
) -> None:
    """Body of a worker thread: as ``worker.worker_main``, with samples handed over as objects."""
    try:
        runner = TaskRunner(setup, handoff, progress, reseed_globals=False)
    except Exception as e:  # noqa: BLE001 - reported to the scheduler
        results.send(("init_error", setup.slot, qualname(type(e)), message_of(e),
                      traceback.format_exc(),
                      type(e)))
        return
    results.send(("ready", setup.slot))
    here = current_run()
    pipe = setup.pipeline
    draws = DrawWatch(pipe.step_names, [pipe.source, *pipe.steps],
                      here.place if here is not None else None)
    set_step = runner.on_step

    def on_step(step: int) -> None:
        set_step(step)
        draws.ran(step)

    runner.on_step = on_step
    runner.measured.on_global_draw = runner.plain.on_global_draw = draws.drew
    while True:
        if runner.runs == WATCH_RUNS:  # watched enough: no more marks (4 µs a step)
            runner.measured.on_global_draw = runner.plain.on_global_draw = None
            runner.on_step = set_step
        task = tasks.get()
        if task is None or tasks.closed:  # close() queues a None behind whatever waits
            return
        if runner.revoked(task):
            continue
        # A resumed sample runs on its own copy of the partial value: the scheduler keeps the
        # original for a retry, and a revoked attempt that races its replacement (see
        # Dispatcher._steal) must not change what the other one works on.
        try:
            value = copy.deepcopy(task.payload) if task.start > 0 else None
        except Exception as e:  # noqa: BLE001 - that sample's error, not the thread's death
            # (a dead thread's samples went to the next thread, which died the same way: the
            # epoch never ended, a bug hunt's find); step -1 reads as 'transport'
            out = Outcome(None, None, [], (-1, e, traceback.format_exc()), 0)
        else:
            out = runner.run(task, value)
        if not results.send(runner.message(task.tid, out, _as_is)):
            return


def _user_place() -> Place | None:
    """The first frame outside headrace on the calling thread (``user_frame``'s rule), or
    None where there is none (a thread started by the scheduler thread)."""
    frame = sys._getframe(user_frame.user_stacklevel() - 1)
    name = frame.f_globals.get("__name__", "")
    if name.startswith("headrace.") or name == "threading":
        return None
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals


def _as_is(value: Any) -> tuple[Any, None]:
    return value, None  # the object itself: same process, no ring
