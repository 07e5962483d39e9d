"""The Ray backend: the ONLY module of headrace that imports ``ray``.

A remote worker is a Ray actor (``remote/actor.py``) on some node of the cluster, and, in the
training process, a proxy thread that stands behind the same ``handles.WorkerHandle`` as a local
worker thread (``runtime/threadworker.py``): a task queue, a result queue the scheduler's
selector watches (or that hands results straight to the scheduler), and a sentinel readable
when the proxy ends. To the scheduler a remote worker is one more worker: exactly-once (task
ids), the retries of a dead worker's samples, the error policy and the state dict are the same
code.

The proxy keeps at most the scheduler's ``DEPTH`` (2) calls queued at its actor (Ray runs one
caller's calls in order), so the actor never waits for the round trip. Results come back
through Ray's object store, with tensors as arrays (``remote/payload.py``).

Faults: when the actor's node or process dies, ``ray.get`` raises; the proxy then ends, its
sentinel fires, and the scheduler re-runs the samples it held on other workers exactly as for
a dead local process (``runtime/deaths.py``). A proxy whose own code raises (any other
exception: a user step's error comes back as a message) ends the same way and counts the
same: lost (and replaced), or, before its actor ran, a start that failed; the sample it was
handling counts an attempt (``progress.tid``), so one that fails every proxy is failed per
the error policy after ``max_restarts``, not retried for ever. The pool does not restart a
remote worker in place (``WorkerHandle.external``): its node may be gone;
``remote/session.py`` starts new ones (``remote/replacing.py``: when).
An actor that dies before it runs (its constructor, or the unpickling of the pipeline it is
given, raised) held no sample: it is reported with the remote exception, not as lost, and
``remote/starts.py`` decides when to stop starting more.
Shutdown (NOTE [headrace shutdown] in ``runtime/worker_stop.py``): closing the task queue ends the
proxy within ``POLL_S`` and it kills its actor; actors are not detached, so Ray also ends them
when the training process exits.

NOTE [no driver-owned objects]: the training process puts nothing in Ray's object store itself.
Ray 2.60's raylet on the training host aborted twice in the remote benchmark (``id.h: Check
failed: binary.size() == T::Size() expected size is 28, but got data size is 75`` in
``NodeManager::HandleFreeLocalObjects``), each time just as one loader's remote workers were
killed and the next loader's were created: the previous loader's ``ray.put`` pipeline was being
freed (Ray 2.60 frees an object by a ``FreeLocalObjects`` call from its owner to each node
holding it) while the next one was put and pinned (``PinObjectIDs``). 75 bytes is the size of
the driver's serialized address here, ``PinObjectIDs``' first field: our reading (not
confirmed in Ray's code) is that a pin request reached the free handler. A
raylet abort on the training host ends every actor of the job and the driver's connection.
Passing the pipeline to each actor's constructor by value lets Ray inline it in the task
(under ``max_direct_call_object_size``, 100 KiB: no object-store entry, nothing to pin or
free); a larger pipeline Ray stores itself, as it does for any large argument. Samples cross
as call arguments and return values, inlined under the same size.
"""

from __future__ import annotations

import logging
import queue
import socket
import time
import traceback
from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayError

from headrace.errors import (
    RemoteUnavailableError,
    message_of,
)
from headrace.pipeline.runner import SampleRunner
from headrace.remote.actor import RemoteWorker
from headrace.remote.config import Remote
from headrace.remote.counts import Outcomes, outcome
from headrace.remote.link import PROBE_BUDGET_S, PROBE_BYTES, LinkEcho, LinkMeasure
from headrace.remote.proxy_calls import local_message, submit
from headrace.remote.proxy_options import ProxyOptions
from headrace.remote.starts import start_cause
from headrace.runtime.outbox import qualname
from headrace.runtime.threadworker import ThreadResults, ThreadTasks
from headrace.runtime.worker import Task, WorkerSetup

log = logging.getLogger("headrace")

POLL_S = 0.05
"""Longest a proxy waits on Ray before checking its task queue again (seconds)."""
CONNECT_TIMEOUT_S = 5.0
"""How long joining a cluster may wait for its address to answer (seconds)."""
START_WARN_S = 30.0
"""A remote worker not placed after this many seconds is reported (the cluster lacks room)."""

_ActorClass = ray.remote(RemoteWorker)
_EchoClass = ray.remote(LinkEcho)


def connect(cfg: Remote) -> None:
    """Join the cluster (or use this process's existing connection to one)."""
    if ray.is_initialized():
        return
    try:
        _check_reachable(cfg.address)
        ray.init(address=cfg.address, log_to_driver=False, include_dashboard=False,
                 configure_logging=False)
    except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ...
        raise RemoteUnavailableError(
            f"headrace could not join the Ray cluster at address {cfg.address!r}: {e}. Start "
            "one (`ray start --head`), pass its address as Remote(address='host:6379' or "
            "'ray://host:10001'), or use Remote(required=False) to run on local workers only."
        ) from e


def _check_reachable(address: str) -> None:
    """Fail within ``CONNECT_TIMEOUT_S`` when ``host:port`` takes no TCP connection (Ray itself
    retries for minutes before giving up). ``"auto"`` and ``"local"`` are Ray's to resolve."""
    target = address.removeprefix("ray://")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        return
    with socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S):
        pass


def cluster_cpus() -> float:
    """CPUs of the live nodes of the cluster (Ray's view)."""
    return float(ray.cluster_resources().get("CPU", 0.0))


def capacity(cfg: Remote) -> int:
    """Remote workers the live nodes can hold now: the cluster's CPUs divided by
    ``num_cpus``, and each custom resource a worker requires divided by its amount (Ray's
    view; one call to the GCS)."""
    total = ray.cluster_resources()
    fits = [total.get("CPU", 0.0) / cfg.num_cpus]
    fits += [total.get(k, 0.0) / v for k, v in (cfg.resources or {}).items() if v > 0]
    return max(0, int(min(fits) + 1e-9))


def probe_link(cfg: Remote, start_timeout_s: float = 30.0) -> LinkMeasure | None:
    """Measure the link to a remote worker's node and the local cost of receiving (see
    ``remote/link.py``); None when no echo actor could be placed within ``start_timeout_s``."""
    opts: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
    if cfg.resources:
        opts["resources"] = dict(cfg.resources)
    echo: Any = _EchoClass.options(**opts).remote()
    try:
        try:
            ray.get(echo.ping.remote(), timeout=start_timeout_s)
        except GetTimeoutError:
            log.warning("headrace: the link probe's actor was not placed within %.0f s; "
                        "bandwidth and offload overhead not measured", start_timeout_s)
            return None
        lat, cpu = [], []
        for _ in range(5):
            t0, c0 = time.perf_counter(), time.thread_time()
            ray.get(echo.ping.remote())
            lat.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        latency, call_cpu = sorted(lat)[len(lat) // 2], sorted(cpu)[len(cpu) // 2]
        walls: list[float] = []
        cpus: list[float] = []
        deadline = time.perf_counter() + PROBE_BUDGET_S
        while not walls or (time.perf_counter() < deadline and len(walls) < 8):
            ref = echo.blob.remote(PROBE_BYTES)
            ray.wait([ref], fetch_local=False)  # made remotely; the transfer is timed below
            t0, c0 = time.perf_counter(), time.thread_time()
            np.array(ray.get(ref), copy=True)  # what receiving a sample does: get, copy out
            walls.append(time.perf_counter() - t0)
            cpus.append(time.thread_time() - c0)
            del ref
        wall = min(walls)
        return LinkMeasure(bandwidth=PROBE_BYTES / max(wall - latency / 2, 1e-6),
                           latency_s=latency, call_cpu_s=call_cpu,
                           cpu_per_byte_s=min(cpus) / PROBE_BYTES, samples=len(walls))
    finally:
        ray.kill(echo, no_restart=True)


def cluster_totals() -> dict[str, float]:
    """Every resource of the live nodes of the cluster, in all (Ray's view; one call to the
    GCS)."""
    return {str(k): float(v) for k, v in ray.cluster_resources().items()}


def resource_total(name: str) -> float:
    """Units of a custom resource on the live nodes of the cluster (e.g. ``headrace_storage``)."""
    return float(ray.cluster_resources().get(name, 0.0))


class RemoteTasks(ThreadTasks):
    """A proxy's task queue: the scheduler ``send``s, the proxy ``take``s with a timeout."""

    _EMPTY = object()

    def take(self, timeout: float) -> Any:
        """The next task, ``None`` (exit), or ``_EMPTY`` after ``timeout`` seconds."""
        try:
            return self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait()
        except queue.Empty:
            return self._EMPTY


def proxy_main(setup: WorkerSetup, tasks: RemoteTasks, results: ThreadResults, progress: Any,
               opts: ProxyOptions, outcomes: Outcomes) -> None:
    """Body of a proxy thread: start the actor, forward tasks, post results (each noted in
    ``outcomes``), until told to exit (``None`` or a closed queue) or the actor dies."""
    cfg, slot = opts.cfg, setup.slot
    actor_opts: dict[str, Any] = {"num_cpus": cfg.num_cpus, "max_restarts": 0,
                                  "max_task_retries": 0}
    if cfg.resources:
        actor_opts["resources"] = dict(cfg.resources)
    # one argument: the dataset and the pipeline reading it stay one object over there
    actor: Any = _ActorClass.options(**actor_opts).remote(setup._replace(
        pipeline=opts.pipeline, cache=None, probe_gil=False, blas_threads=None))
    ran = False
    try:
        started = _wait_placed(actor, tasks, slot, opts)
        if started is None:
            return
        ran = True
        if opts.on_started is not None:
            opts.on_started(slot)
        if started[0] == "init_error":  # worker_init_fn raised: the epoch fails, as locally
            results.send(("init_error", slot, *started[1:]))
            return
        results.send(("ready", slot, started[1]))
        _forward(actor, tasks, results, progress, opts, setup, outcomes)
    except RayError as e:
        if not ran:  # it held no sample: say why it never started (its constructor's error)
            if opts.on_start_failed is not None:
                opts.on_start_failed(slot, start_cause(type(e).__name__, str(e)))
            return
        first = (str(e).strip().splitlines() or [""])[0]
        log.warning("headrace remote worker %d lost (%s: %s); its samples are re-run",
                    slot, type(e).__name__, first)
        if opts.on_lost is not None:
            opts.on_lost(slot)
    except Exception as e:  # noqa: BLE001 - the proxy's own code failed (a user step's
        # error is a message, never raised here): counted and replaced as a lost worker
        if not ran:  # before its actor ran: a start that failed (bounded: remote/starts.py)
            if opts.on_start_failed is not None:
                opts.on_start_failed(slot, f"{qualname(type(e))}: {message_of(e)} (raised in "
                                           "its proxy thread, in the training process)")
            return
        log.warning("headrace remote worker %d lost: its proxy thread failed; its samples "
                    "are re-run and it is replaced:\n%s", slot, traceback.format_exc())
        if opts.on_lost is not None:
            opts.on_lost(slot)
    finally:
        # progress.tid keeps the task at the head of the actor's queue: the scheduler counts
        # an attempt against that sample (a sample that keeps killing actors is failed per
        # the error policy, not retried for ever)
        opts.placed.pop(slot, None)
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - the actor or the connection is already gone
            pass


def _wait_placed(actor: Any, tasks: RemoteTasks, slot: int,
                 opts: ProxyOptions) -> tuple[Any, ...] | None:
    """Wait until the actor runs, and return how its start went (``RemoteWorker.started``);
    None when the proxy is told to exit first."""
    ref = actor.where.remote()
    t0 = time.monotonic()
    warned = False
    while not tasks.closed:
        try:
            host, pid, node, started = ray.get(ref, timeout=POLL_S)
        except GetTimeoutError:
            if not warned and time.monotonic() - t0 > START_WARN_S:
                warned = True
                cfg = opts.cfg
                log.warning("headrace remote worker %d not placed after %.0f s: no node of the "
                            "cluster has room for what it asks for (num_cpus=%g, resources=%s)",
                            slot, START_WARN_S, cfg.num_cpus, dict(cfg.resources or {}))
            continue
        log.info("headrace remote worker %d runs on %s (node %s, pid %d)", slot, host, node, pid)
        opts.placed[slot] = node
        return tuple(started)
    return None


def _forward(actor: Any, tasks: RemoteTasks, results: ThreadResults, progress: Any,
             opts: ProxyOptions, setup: WorkerSetup, outcomes: Outcomes) -> None:
    slot = setup.slot
    # the training process's global generators are the training loop's: not re-seeded here
    # (a load that draws from them goes back to the local workers: ``proxy_calls.submit``)
    local = SampleRunner(setup.pipeline, None, False) if opts.read_local else None
    # object ref -> (task, local timings, the step its remote part ends at)
    inflight: dict[Any, tuple[Task, list[Any], int]] = {}
    retiring = False  # told to exit (retired): finish what the actor holds first
    while not tasks.closed:
        while not retiring:  # take what the scheduler queued; wait only when the actor idles
            task = tasks.take(0.0 if inflight else POLL_S)
            if task is RemoteTasks._EMPTY:
                break
            if tasks.closed:
                return  # shutdown: in-flight samples are discarded (never delivered)
            if task is None:
                retiring = True
                break
            if progress.is_revoked(slot, task.tid):
                continue  # moved to an idle worker while queued here (Dispatcher._steal)
            try:
                sent = submit(actor, task, opts, local)
            except Exception:
                progress.tid[slot] = task.tid  # the sample it failed on counts an attempt
                raise
            if sent[0] == "msg":
                if not results.send(sent[1]):
                    return
                continue
            if not inflight:
                progress.started[slot] = time.monotonic()
                progress.tid[slot] = task.tid
            inflight[sent[1]] = (task, sent[2], sent[3])
        if not inflight:
            if retiring:
                return
            continue
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=POLL_S)
        for ref in ready:
            task, before, stop = inflight.pop(ref)
            msg = ray.get(ref)  # raises when the actor died: the scheduler re-runs its samples
            progress.tid[slot] = task.tid  # a failure below is charged to this sample
            local_msg = local_message(msg, before, opts)
            head = next(iter(inflight.values()), None)
            progress.started[slot] = time.monotonic()
            progress.tid[slot] = head[0].tid if head is not None else -1
            # counted once the scheduler takes it (never a result it drops as stale), against
            # the stop it ran with: a replan may have moved the split since
            outcomes.expect(task.tid, outcome(msg, stop, opts.stops is not None),
                            (task.epoch, task.sample, task.draw), fresh=task.start == 0)
            if not results.send(local_msg):
                return
