"""What a remote worker runs: the pipeline's steps ``[start, stop)`` of one sample.

A plain class (no Ray import): ``ray_backend`` wraps it with ``ray.remote``. It runs in a Ray
worker process on some node, with the same ``TaskRunner`` a local worker process uses, so the
per-(sample, step) seeds, the re-seeding of the global generators, the timings and size
measurements and the error messages are those of a local worker: a sample finished remotely is
the sample a local worker would have finished. To the user's code it is one of torch's workers,
as a local worker process is (``runtime/torch_worker.py``'s ``init_as_torch_worker``):
``get_worker_info()`` answers with its slot as id (after every local slot), the loader's
worker slots, local and remote, as ``num_workers``, its seed and the dataset, and
``worker_init_fn`` runs once, when the actor starts. A sample over the training process's
hand-off timeout is handed back after a step as a local worker hands it off (the proxy sends the
timeout and the typical seconds left per step with each call), so a slow sample does not hold
the remote worker while the ones queued behind it wait.
"""

from __future__ import annotations

import os
import socket
import traceback
from types import SimpleNamespace
from typing import Any

from headrace.errors import message_of, picklable_class
from headrace.remote.payload import pack, unpack
from headrace.runtime.outbox import qualname
from headrace.runtime.torch_worker import init_as_torch_worker
from headrace.runtime.worker import Task, TaskRunner, WorkerSetup


def _progress(slots: int) -> SimpleNamespace:
    """A ``handles.Progress`` of ``slots`` slots for a ``TaskRunner`` to write in its own
    slot (nobody reads it here)."""
    return SimpleNamespace(tid=[-1] * slots, started=[0.0] * slots, step=[0] * slots,
                           revoked=[-1] * slots, order_broke=[0] * slots)


class RemoteWorker:
    """One remote worker: runs tasks one after another (Ray runs an actor's calls in order)."""

    def __init__(self, setup: WorkerSetup) -> None:
        """``setup``: the pool's for this worker's slot (``num_workers``: the loader's worker
        slots, local and remote), with no cache (``remote/session.py``), pickled as one
        argument so that ``setup.dataset`` is the very object the pipeline reads, as in a local
        worker."""
        import torch

        torch.set_num_threads(1)  # as a local worker process: one core per worker
        self.started: tuple[Any, ...]
        """What ``where`` reports: ``("ready", reseeded)``, or ``("init_error", cause type,
        message, traceback, exception class or None)`` when ``worker_init_fn`` (or setting up
        as a torch worker) raised: the training process then fails as for a local worker."""
        try:
            self.started = ("ready", init_as_torch_worker(setup))
        except Exception as e:  # noqa: BLE001 - reported to the training process by where()
            self.started = ("init_error", qualname(type(e)), message_of(e),
                            traceback.format_exc(), picklable_class(type(e)))
        pipeline = setup.pipeline
        handoff = SimpleNamespace(timeout=SimpleNamespace(value=float("inf")),
                                  remaining=[float("inf")] * (len(pipeline.step_names) + 1))
        self.runner = TaskRunner(setup, handoff, _progress(setup.slot + 1))
        self.steps = len(pipeline.step_names)
        self._stop = self.steps
        self._late = self.runner.hand_off  # the local rule, over ``handoff`` below
        self._handoff = handoff

        def split(next_step: int, spent: float) -> bool:
            # hand the sample back at the split point, or, like a local worker, when it is
            # over the timeout with work worth moving left (runtime/worker.py's rule)
            return next_step >= self._stop or self._late(next_step, spent)

        self.runner.hand_off = split
        # no cache here, but the local workers that finish a sample handed back store its forms:
        # where its steps here drew from a global generator travels with it (cache/running.py)
        self.runner.watch_draws = True

    def where(self) -> tuple[str, int, str, tuple[Any, ...]]:
        """(host name, process id, Ray node id, ``started``): where this worker runs, and how
        its start as a torch worker went."""
        import ray  # in the actor's process, which Ray started

        return (socket.gethostname(), os.getpid(), ray.get_runtime_context().get_node_id(),
                self.started)

    def run(self, task: Task, stop: int, value: Any,
            handoff: tuple[float, tuple[float, ...]] | None = None) -> tuple[Any, ...]:
        """Run steps ``task.start..stop-1`` of ``task.sample`` and return the worker message
        (``runtime/worker.py``'s ``done`` / ``partial`` / ``error``) with the value packed as
        arrays. ``value``: the packed partial value when ``task.start > 0``. ``handoff``: the
        training process's hand-off timeout (seconds) and, per step position, the typical
        seconds left from there (``handles.HandOff``) when the task may be handed off over the
        timeout; None: it runs to ``stop``."""
        self._stop = stop
        late = handoff is not None and task.may_hand_off
        self._handoff.timeout.value = handoff[0] if late and handoff else float("inf")
        if late and handoff:
            self._handoff.remaining[:] = list(handoff[1])
        task = task._replace(may_hand_off=stop < self.steps or late)
        out = self.runner.run(task, unpack(value) if task.start > 0 else None)
        return self.runner.message(task.tid, out, lambda v: (pack(v), None))
