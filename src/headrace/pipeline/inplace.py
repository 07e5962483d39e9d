"""A dataset's Compose-like transform, profiled step by step where the dataset calls it.

A user's ``__getitem__`` may call ``self.transform(x)`` unconditionally, post-process after it,
apply it to two views or to something other than element 0 of its sample. Splitting the
transform out of the dataset would change what ``__getitem__`` computes. Instead headrace runs
the dataset as it is, on a copy whose ``transform`` is a copy of the user's Compose-like object
whose ``transforms`` list holds :class:`Timed` wrappers: the Compose's own ``__call__`` runs,
each wrapper calls the original transform with the same arguments and returns its result
unchanged, and measures it for the profiler. The user's dataset and transform objects are
never modified, nothing is set to ``None``, and the result is the same, value for value, as the
dataset run by itself (tested against torch's loader).

The measurements go to the :class:`Probe` the sample runner installs in this thread for the
duration of one ``load`` (``probing``); outside of it the wrappers only call through.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from headrace.pipeline.step import Step

_local = threading.local()


class Probe:
    """Per-step measurements of one sample's run, summed over the calls the dataset made.

    ``wall`` / ``cpu``: seconds per step (transform position 0..n-1); ``bytes_out``: payload
    bytes of the step's last output (−1: not measured); ``changed``: the output's type
    signature differs from its input's; ``bytes_in``: payload bytes of the first transform's
    first input (the sample before any transform: the "load" output); ``failed``: position of
    the transform that raised, if one did.
    """

    def __init__(self, n: int, measure: Callable[[Any], tuple[int, Hashable]] | None,
                 rngs: Callable[[int, int], Any]) -> None:
        self.measure = measure
        self.rngs = rngs  # (position, call) -> numpy Generator for a random headrace Step
        self.wall = [0.0] * n
        self.cpu = [0.0] * n
        self.bytes_out = [-1] * n
        self.changed = [False] * n
        self.calls = [0] * n
        self.bytes_in = -1
        self.failed: int | None = None


@contextlib.contextmanager
def probing(probe: Probe) -> Iterator[Probe]:
    """Let the wrappers of this thread report to ``probe`` while the block runs."""
    prev = getattr(_local, "probe", None)
    _local.probe = probe
    try:
        yield probe
    finally:
        _local.probe = prev


class Timed:
    """One transform of a Compose-like list: called exactly as the original, measured.

    A random headrace :class:`~headrace.pipeline.step.Step` in the list gets its ``rng`` here
    (seeded per sample, step and call), which a plain Compose could not give it.
    """

    def __init__(self, fn: Any, position: int) -> None:
        self.fn = fn
        self.position = position

    def __getattr__(self, name: str) -> Any:  # attributes of the original transform
        if name in ("fn", "position"):
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __repr__(self) -> str:
        return repr(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        probe: Probe | None = getattr(_local, "probe", None)
        fn = self.fn
        if isinstance(fn, Step) and fn.random and len(args) == 1 and not kwargs:
            call = self.position, (probe.calls[self.position] if probe is not None else 0)
            args = (args[0], probe.rngs(*call) if probe is not None else None)
        if probe is None:
            return fn(*args, **kwargs)
        k = self.position
        measure = probe.measure
        sig_in = None
        if measure is not None and args:
            size_in, sig_in = measure(args[0])
            if probe.bytes_in < 0 and k == 0:
                probe.bytes_in = size_in
        ws, cs = time.perf_counter(), time.thread_time()
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            probe.failed = k
            raise
        finally:
            probe.wall[k] += time.perf_counter() - ws
            probe.cpu[k] += time.thread_time() - cs
            probe.calls[k] += 1
        if measure is not None:
            probe.bytes_out[k], sig_out = measure(out)
            probe.changed[k] = sig_in is not None and sig_out != sig_in
        return out


def transform_list(dataset: Any) -> list[Any] | None:
    """The ``transform.transforms`` list of a dataset with a Compose-like transform, else None."""
    tf = getattr(dataset, "transform", None)
    parts = getattr(tf, "transforms", None)
    if tf is not None and callable(tf) and isinstance(parts, (list, tuple)) and parts:
        return list(parts)
    return None


def instrumented_copy(dataset: Any) -> Any | None:
    """A shallow copy of ``dataset`` whose transform (a shallow copy of the user's) holds
    :class:`Timed` wrappers, or ``None`` when the objects cannot be copied that way (the
    dataset then runs as it is, unprofiled per step)."""
    parts = transform_list(dataset)
    if parts is None:
        return None
    tf = dataset.transform
    wrapped = [Timed(t, k) for k, t in enumerate(parts)]
    try:
        tf_copy = copy.copy(tf)
        tf_copy.transforms = type(tf.transforms)(wrapped)
        ds_copy = copy.copy(dataset)
        ds_copy.transform = tf_copy
    except Exception:  # noqa: BLE001 - slots, properties, frozen classes: leave it alone
        return None
    if ds_copy.transform is not tf_copy or tf_copy.transforms[0] is not wrapped[0]:
        return None  # a property or __setattr__ did something else with the assignment
    return ds_copy
