"""What a remote worker runs: the pipeline's steps ``[start, stop)`` of one sample.

A plain class (no Ray import): ``ray_backend`` wraps it with ``ray.remote``. It runs in a Ray
worker process on some node, with the same ``TaskRunner`` a local worker process uses, so the
per-(sample, step) seeds, the re-seeding of the global generators, the timings and size
measurements and the error messages are those of a local worker: a sample finished remotely is
the sample a local worker would have finished. A sample over the training process's hand-off
timeout is handed back after a step as a local worker hands it off (the proxy sends the timeout
and the typical seconds left per step with each call), so a slow sample does not hold the
remote worker while the ones queued behind it wait.
"""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace
from typing import Any

from headrace.pipeline import Pipeline
from headrace.remote.payload import pack, unpack
from headrace.runtime.worker import Task, TaskRunner, WorkerSetup


def _progress() -> SimpleNamespace:
    """The one-slot ``handles.Progress`` a ``TaskRunner`` writes (nobody reads it here)."""
    return SimpleNamespace(tid=[-1], started=[0.0], step=[0], revoked=[-1])


class RemoteWorker:
    """One remote worker: runs tasks one after another (Ray runs an actor's calls in order)."""

    def __init__(self, pipeline: Pipeline, base_seed: int, profile: bool) -> None:
        import torch

        torch.set_num_threads(1)  # as a local worker process: one core per worker
        setup = WorkerSetup(slot=0, num_workers=1, base_seed=base_seed, pipeline=pipeline,
                            dataset=None, worker_init_fn=None, parent_pid=os.getppid(),
                            profile=profile)
        handoff = SimpleNamespace(timeout=SimpleNamespace(value=float("inf")),
                                  remaining=[float("inf")] * (len(pipeline.step_names) + 1))
        self.runner = TaskRunner(setup, handoff, _progress())
        self.steps = len(pipeline.step_names)
        self._stop = self.steps
        self._late = self.runner.hand_off  # the local rule, over ``handoff`` below
        self._handoff = handoff

        def split(next_step: int, spent: float) -> bool:
            # hand the sample back at the split point, or, like a local worker, when it is
            # over the timeout with work worth moving left (runtime/worker.py's rule)
            return next_step >= self._stop or self._late(next_step, spent)

        self.runner.hand_off = split

    def where(self) -> tuple[str, int, str]:
        """(host name, process id, Ray node id): where this worker runs."""
        import ray  # in the actor's process, which Ray started

        return socket.gethostname(), os.getpid(), ray.get_runtime_context().get_node_id()

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
