"""headrace's own options, grouped in one frozen object (torch's keywords stay keywords)."""

from __future__ import annotations

import dataclasses
import numbers
import operator
import os
from typing import Any, Literal

import numpy as np
import torch

from headrace.cache.config import Cache
from headrace.planner.timeout import TimeoutConfig
from headrace.planner.workers import AutoscaleConfig
from headrace.remote.config import Remote


class AutoWorkers(int):
    """``num_workers="auto"`` as a loader keeps it: an ``int`` (the workers it starts with)
    that remembers it was ``"auto"``. Code written for torch reads ``loader.num_workers`` as a
    number, and a loader rebuilt from its attributes (Lightning's and Accelerate's sampler
    injection) adapts its workers too."""

    def __repr__(self) -> str:
        return f"AutoWorkers({int(self)})"

    def __reduce__(self) -> tuple[type, tuple[int]]:
        return (AutoWorkers, (int(self),))


@dataclasses.dataclass(frozen=True)
class Options:
    """What headrace adds to torch's DataLoader keywords.

    A value of the wrong type (``timeout=5``, ``collate_threads=2.0``, ``profile="no"``) is a
    ``TypeError`` naming the field when the options are built.

    Attributes:
        seed: when set, the loader's generator (torch's ``generator`` keyword) is one seeded
            with this value: torch's ``shuffle=True`` sampler draws each epoch's order from it,
            and the epoch's base seed (each sample's seeds, ``get_worker_info().seed``) is drawn
            from it, so these do not depend on the global torch RNG, and the state dict holds
            it (resume is exact across epochs whatever the training loop draws). A ``sampler``
            or ``batch_sampler`` built by the user draws from its own generator, or without one
            from torch's global generator, as in torch: its order still follows
            ``torch.manual_seed`` (what each sample holds does not). With ``generator=`` also
            given, that generator is the loader's and ``seed`` does not seed it (a warning
            says so when their seeds differ; ``headrace.integrations.accelerate``'s
            ``DistributedSampler`` takes ``seed`` first). ``None`` keeps torch's semantics
            (the global RNG or the ``generator`` keyword). Same seed, same samples, with the
            steps in one order: a second run of a script may reorder a ``Pipeline``'s movable
            steps from its first epoch (AutoOrder, from the stored profile); ``reorder=False``
            keeps runs identical from their first epoch.
        on_error: ``"raise"`` re-raises a failing step in the training process with the sample
            index and step name; ``"skip"`` drops that sample from the epoch and counts it
            (refused over an ``IterableDataset``, whose samples torch's iterator runs).
        max_in_flight: samples dispatched to workers but not yet yielded to the training loop
            (default: ``prefetch_factor × workers × batch_size``, torch's own bound). Where
            batches are regrouped (sample-aware batching) at least ``batch_size``: the finished
            samples of a batch wait in flight for each other, and under that bound no batch
            filled and the epoch hung.
        handoff: hand samples over the learned timeout to the slow lane (MinatoLoader), when the
            steps they have left are expected (from the profile) to take at least half the
            timeout; a move that saves nothing is not made.
        slow_lane_share: share of workers (0..1) that may run slow-lane samples (those handed
            off over the timeout) at the same time while fresh samples may start, rounded down,
            at least one worker for a share above 0; the rest serve the fast lane. When no
            fresh sample may start (the in-flight bound reached, the epoch's last samples),
            any worker takes slow-lane work, so a handed-off sample always finishes; with 0 it
            waits until then. A slow lane holding more samples than there are workers lifts
            the share (its samples would otherwise fill the in-flight bound while waiting).
        timeout: the learned hand-off timeout, a :class:`headrace.TimeoutConfig` (see
            ``headrace.planner.timeout``); not torch's ``timeout=`` keyword of the loader,
            the wait for a batch in seconds.
        autoscale: the worker scaler used with ``num_workers="auto"``.
        max_worker_restarts: a sample whose worker died this many times is treated as failed
            (2: retried once elsewhere); a worker slot whose workers die more times than this
            in a row while starting (before running a sample) raises ``WorkerDiedError``.
        sample_timeout_s: a sample running longer than this (seconds, in one worker) is taken for
            a hung step: its worker is replaced and the sample retried, then failed per
            ``on_error``. ``None``: no limit (the default; the slow lane handles slow samples).
            Refused over an ``IterableDataset`` (torch's ``timeout=`` bounds a batch's wait).
        worker_blas_threads: threads of the native thread pools (OpenBLAS, OpenMP, MKL) in each
            worker process; 1 (default) as torch does for its own pool in workers, since the
            workers are the parallelism: NumPy's OpenBLAS otherwise starts a thread per core
            in every worker, and they spin (on the speech pipeline 5 workers burned 1.9 of 2
            cores where the steps needed 0.3; ``runtime/native_threads.py``). The count can
            change the last bits of BLAS results, as between machines. ``None``: inherited
            unchanged (torch's DataLoader). The training process is never changed, nor are
            worker threads (``executor="threads"``), which are in it.
        profile: measure every step (time and CPU on every sample, all of which reach the
            profile; output bytes and type changes on a worker's first 64 samples, then one in
            8, as they cost a few µs per step); feeds ``explain()``, the planner, the hand-off
            rule and the profile store.
        reorder: let AutoOrder (Pecan) reorder steps declared ``random=True`` or
            ``commutes=True`` within their sections, from the next epoch on (or from the
            start when a stored profile exists). ``False`` keeps the declared order.
        profile_store: where profiles are kept between runs, keyed by pipeline, dataset and
            machine: ``True`` the user cache directory (or ``$HEADRACE_PROFILE_STORE``), a
            file path, a directory (one that exists, or a path ending in ``/``: its
            ``profiles.sqlite``), or ``False`` (or ``None``) for none. A stored profile skips
            the warm-up. A file that is not a profile store (a config file, a database of your
            own) is never written: the loader logs a warning naming it (logger ``headrace``) and
            keeps its profile in memory.
        executor: what runs the ``num_workers`` workers. ``"processes"`` (torch's way): worker
            processes, each sample copied to the training process through shared memory.
            ``"threads"``: threads of the training process, samples handed over without a copy
            or a message. It can only pay when the steps spend their time in code that
            releases the GIL (Pillow, OpenCV, NumPy on large arrays, I/O); README's worker
            threads paragraph gives the latest full run's numbers (docs/benchmarks.md). With
            threads, steps must draw randomness from their ``rng`` (the global generators are
            shared and not re-seeded), ``get_worker_info()`` is ``None``, ``worker_init_fn``
            and ``sample_timeout_s`` are refused (a thread cannot be killed), and dataset and
            step objects are shared by the threads. See ``runtime/threadworker.py``.
            ``"auto"``: processes, whose workers measure during the first epoch how much of
            their steps' time holds the GIL (``runtime/gilprobe.py``); threads from the next
            epoch on when the GIL would not limit them (``planner/executor.py``; the decision
            and its numbers are in ``explain()``), and back to processes for good when
            threads' first epochs (added up to at least 1 s) deliver under 0.9x the samples/s
            of processes' last ones (the probe reads steps that let go of the GIL often but
            briefly as free). Threads are considered only where they cannot change what the
            code computes, beyond the last bits of multithreaded native operations (worker
            threads use the training process's BLAS and torch thread pools, worker processes
            one thread each): a ``Pipeline`` (its random steps draw from their ``rng``, and no
            step was seen, on any sample of the probing epoch, drawing from Python's, NumPy's
            or torch's global generator, calling ``get_worker_info()``, which worker threads
            answer with ``None``, or setting an attribute of the source or of a step object,
            such as a file handle opened on first use, which threads would share), torch's
            default collation, no ``worker_init_fn``, ``sample_timeout_s`` or ``remote``;
            anything else stays on processes.
        device: device prefetch (``runtime/prefetch.py``): ``"cuda"``, ``"cuda:N"`` or a
            ``torch.device`` (e.g. ``torch.accelerator.current_accelerator()``). The next
            batches are copied there on a side CUDA stream while the current one trains, from
            pinned batch memory (implied), and ``next()`` returns device tensors ready on the
            training loop's current stream. ``None`` (default) or ``"cpu"`` (a
            ``torch.device("cpu")``): batches stay in host memory, as without the option (no
            copy, no pinning implied), so ``"cuda" if torch.cuda.is_available() else "cpu"``
            works on either machine.
        collate_threads: threads of the training process that run a user ``collate_fn``
            (headrace collates there: batch composition is known only there). 1 (default): one
            call at a time, batch after batch, off the scheduler thread, as each of torch's
            workers calls it: a ``collate_fn`` that keeps state, reuses a buffer or wraps a
            tokenizer refusing concurrent calls stays correct. More: batches collated
            concurrently, for a thread-safe ``collate_fn`` that releases the GIL (a 20 ms one
            that sleeps: 0.89x torch's epoch with 4 threads, 1.56x with one;
            docs/benchmarks.md). At most the available cores are used.
        cache: Seneca's tiered sample cache (:class:`headrace.Cache`; ``None`` or ``False``: off). Default:
            a memory cache whose budget is 25% of the available memory, within the
            process's memory cgroup, off under 256 MB (see ``Cache``); it
            caches a Pipeline's decoded form (else its encoded form), so epochs after the
            first skip those steps. A Dataset caches nothing by default, whether opaque or
            with a Compose whose transforms run inside its ``__getitem__``: its only form, the
            final output, is exact only within one epoch (``Cache(shared_augmented=True)``
            reuses it across epochs; ``explain()`` says the cache is off and why).
    """

    seed: int | None = None
    on_error: Literal["raise", "skip"] = "raise"
    max_in_flight: int | None = None
    handoff: bool = True
    slow_lane_share: float = 0.25
    timeout: TimeoutConfig = dataclasses.field(default_factory=TimeoutConfig)
    autoscale: AutoscaleConfig = dataclasses.field(default_factory=AutoscaleConfig)
    max_worker_restarts: int = 2
    sample_timeout_s: float | None = None
    worker_blas_threads: int | None = 1
    profile: bool = True
    reorder: bool = True
    profile_store: str | os.PathLike[str] | bool = True
    executor: Literal["processes", "threads", "auto"] = "processes"
    device: str | torch.device | None = None
    cache: Cache | None = dataclasses.field(default_factory=Cache)
    remote: Remote | None = None
    collate_threads: int = 1

    def __post_init__(self) -> None:
        self._check_types()
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if not 0 <= self.slow_lane_share <= 1:
            raise ValueError("slow_lane_share must be in [0, 1]")
        if self.sample_timeout_s is not None and self.sample_timeout_s <= 0:
            raise ValueError("sample_timeout_s must be > 0 (or None)")
        if self.executor not in ("processes", "threads", "auto"):
            raise ValueError("executor must be 'processes', 'threads' or 'auto', got "
                             f"{self.executor!r}")
        if self.executor == "threads" and self.sample_timeout_s is not None:
            raise ValueError("sample_timeout_s needs executor='processes': a worker thread stuck "
                             "in a step cannot be killed and replaced")
        if self.device is not None:
            try:  # a malformed device string fails here, with torch's words
                torch.device(self.device)
            except RuntimeError as e:  # an index with no accelerator: torch names no argument
                raise ValueError(f"Options(device={self.device!r}): {e}") from e
        if self.remote is not None and not isinstance(self.remote, Remote):
            raise ValueError(f"remote must be a headrace.Remote, got {self.remote!r}")
        if self.collate_threads < 1:
            raise ValueError(f"collate_threads must be >= 1, got {self.collate_threads}")
        if self.worker_blas_threads is not None and self.worker_blas_threads < 1:
            raise ValueError("worker_blas_threads must be >= 1 (or None: inherited)")
        if self.max_worker_restarts < 1:
            raise ValueError("max_worker_restarts must be >= 1")

    def _check_types(self) -> None:
        """Raise a ``TypeError`` naming the field for a value of the wrong type, when the
        options are built: such values used to fail later, in words that named no field
        (``timeout=5`` in ``DataLoader()``, ``worker_blas_threads=2.5`` in a worker's start,
        blaming ``worker_init_fn``). Integers given as NumPy's are kept as ``int``;
        ``cache=False`` is kept as ``None`` and ``profile_store=None`` as ``False`` (off)."""
        if self.seed is not None:
            seed = _integer("seed", self.seed, "an int, the loader generator's seed, or None")
            if not -2**63 <= seed < 2**64:  # what torch.Generator.manual_seed takes
                raise ValueError(f"seed must be in [-2**63, 2**64) (torch.Generator's seed "
                                 f"range), got {seed}")
            object.__setattr__(self, "seed", seed)
        for name, wanted in (("max_in_flight", "an int, samples in flight, or None"),
                             ("max_worker_restarts", "an int, deaths of a sample's worker"),
                             ("worker_blas_threads", "an int, threads per worker, or None"),
                             ("collate_threads", "an int, threads running collate_fn")):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _integer(name, getattr(self, name), wanted))
        object.__setattr__(self, "slow_lane_share", _real(
            "slow_lane_share", self.slow_lane_share, "a share of workers in [0, 1]"))
        if self.sample_timeout_s is not None:
            object.__setattr__(self, "sample_timeout_s", _real(
                "sample_timeout_s", self.sample_timeout_s, "seconds, or None"))
        for name in ("handoff", "profile", "reorder"):
            object.__setattr__(self, name, _switch(name, getattr(self, name)))
        if self.profile_store is None:  # falsy, as it always worked: no store
            object.__setattr__(self, "profile_store", False)
        if isinstance(self.profile_store, bytes):  # a path as bytes, as os.fspath gives one
            object.__setattr__(self, "profile_store", os.fsdecode(self.profile_store))
        if not isinstance(self.profile_store, (bool, str, os.PathLike)):
            raise TypeError("Options(profile_store=...) takes True (the user cache directory), "
                            f"False (none) or a path, got {self.profile_store!r}")
        if not isinstance(self.timeout, TimeoutConfig):
            raise TypeError(
                "Options(timeout=...) takes a headrace.TimeoutConfig (the learned hand-off "
                f"timeout), got {self.timeout!r}; torch's timeout= keyword of DataLoader is "
                "the wait for a batch in seconds")
        if not isinstance(self.autoscale, AutoscaleConfig):
            raise TypeError("Options(autoscale=...) takes a headrace.AutoscaleConfig (the "
                            f"scaler of num_workers='auto'), got {self.autoscale!r}")
        if self.cache is False:
            object.__setattr__(self, "cache", None)
        if self.cache is not None and not isinstance(self.cache, Cache):
            raise TypeError(f"Options(cache=...) takes a headrace.Cache(...) or None (off), got "
                            f"{self.cache!r}")


def _integer(name: str, value: Any, wanted: str) -> int:
    """``value`` as an ``int`` (an ``int`` or what has ``__index__``: NumPy's integers), else a
    ``TypeError`` naming the field ``name`` and what it takes (``wanted``); ``True`` and
    ``False`` are refused (``seed=True`` is a mistake, not seed 1)."""
    if isinstance(value, bool):
        raise TypeError(f"Options({name}=...) takes {wanted}, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"Options({name}=...) takes {wanted}, got {value!r} of type "
                        f"{type(value).__qualname__}") from None


def _real(name: str, value: Any, wanted: str) -> float:
    """``value`` itself if a Python ``int`` or ``float``, else as a ``float`` (a number:
    NumPy's, a 0-d tensor, a ``Decimal``), else a ``TypeError`` naming the field ``name``; a
    bool and a string such as ``"5"`` are refused (``"5" < 0`` failed deep in the loader)."""
    if type(value) in (int, float):  # as given: messages quote it as the user wrote it
        return value
    if not isinstance(value, (bool, str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError):
            pass
    raise TypeError(f"Options({name}=...) takes {wanted}, got {value!r} of type "
                    f"{type(value).__qualname__}")


def _switch(name: str, value: Any) -> bool:
    """``value`` as a ``bool``: ``True``/``False``, NumPy's bools, 0 and 1, ``None`` (off, as
    its falsiness always meant); anything else (a string: ``"no"`` meant on) a ``TypeError``
    naming the field ``name``."""
    if value is None or isinstance(value, (bool, np.bool_)) or (
            isinstance(value, numbers.Integral) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"Options({name}=...) takes True or False, got {value!r}")
