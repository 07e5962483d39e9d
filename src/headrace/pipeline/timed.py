"""The timing wrapper of one transform of a dataset's Compose (:class:`Timed`), and the
per-sample measurements the wrappers of one thread report to (:class:`Probe`, installed for
one ``load`` by :class:`Probing`). ``pipeline/inplace.py`` sets the wrappers as a Compose's
``transforms`` while the dataset runs; outside a :class:`Probing` block they only call through.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from headrace.pipeline.step import Step

_local = threading.local()


class Probe:
    """Per-step measurements of one sample's run, summed over the calls the dataset made.

    ``wall`` / ``cpu``: seconds per step (transform position 0..n-1); ``bytes_out``: payload
    bytes of the step's last output (−1: not measured); ``changed``: the output's type
    signature differs from its input's; ``reshaped``: its dtype/shape signature does;
    ``bytes_in``: payload bytes of the first transform's
    first input (the sample before any transform: the "load" output); ``failed``: position of
    the transform that raised, if one did.
    """

    def __init__(self, n: int, measure: Callable[[Any], tuple[int, Hashable, Hashable]] | None,
                 rngs: Callable[[int, int], Any], timed: bool = True) -> None:
        self.measure = measure
        self.rngs = rngs  # (position, call) -> numpy Generator for a random headrace Step
        self.timed = timed  # False: count calls and note a failure only (wall, cpu stay 0)
        self.wall = [0.0] * n
        self.cpu = [0.0] * n
        self.bytes_out = [-1] * n
        self.changed = [False] * n
        self.reshaped = [False] * n
        self.calls = [0] * n
        self.bytes_in = -1
        self.failed: int | None = None


class Probing:
    """``with Probing(probe):`` lets the wrappers of this thread report to ``probe`` while the
    block runs (a class rather than a generator context manager: it runs once a sample)."""

    __slots__ = ("prev", "probe")

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.prev: Probe | None = None

    def __enter__(self) -> Probe:
        self.prev = getattr(_local, "probe", None)
        _local.probe = self.probe
        return self.probe

    def __exit__(self, *_exc: object) -> None:
        _local.probe = self.prev


class Timed:
    """One transform of a Compose-like list: called exactly as the original, measured.

    A random headrace :class:`~headrace.pipeline.step.Step` in the list gets its ``rng`` here
    (seeded per sample, step and call), which a plain Compose could not give it.

    To the dataset's code it passes for the original: ``isinstance`` and ``__class__`` answer
    with the original's class (MONAI's ``CacheDataset`` finds where to resume its Compose with
    ``isinstance(t, RandomizableTrait)``: with the wrapper's class, the transforms it had
    cached the results of ran a second time), and a copy or a pickle of it is a copy of the
    original, unwrapped. ``type(t)`` is a subclass of this one named as the original's class
    (:func:`timed`), so only an identity test (``type(t) is X``) tells them apart. It compares
    equal to the original and hashes as it does, so ``transforms.index(self.normalize)``,
    ``self.normalize in transforms`` and a dict keyed by the transforms find it; only
    ``t is self.normalize`` sees the wrapper (README, differences).
    """

    def __init__(self, fn: Any, position: int) -> None:
        self.fn = fn
        self.position = position

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: D105 - what isinstance() reads after type()
        return type(self.fn)

    def __copy__(self) -> Any:  # a copy of the original: writes to it stay in the copy
        return copy.copy(self.fn)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return copy.deepcopy(self.fn, memo)

    def __reduce_ex__(self, protocol: Any) -> Any:  # pickled: the original
        return _original, (self.fn,)

    def __getattr__(self, name: str) -> Any:  # attributes of the original transform
        if name in ("fn", "position"):
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __setattr__(self, name: str, value: Any) -> None:  # ... written to it too
        if name in ("fn", "position"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.fn, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self.fn, name)

    def __repr__(self) -> str:
        return repr(self.fn)

    def __eq__(self, other: object) -> bool:
        return bool(self.fn == unwrapped(other))

    def __hash__(self) -> int:  # the original's (raises where it is unhashable)
        return hash(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        probe: Probe | None = getattr(_local, "probe", None)
        if probe is not None and self.position >= len(probe.calls):
            probe = None  # another loader's wrappers, of a Compose grown since this one was built
        fn = self.fn
        if isinstance(fn, Step) and fn.random and len(args) == 1 and not kwargs:
            call = self.position, (probe.calls[self.position] if probe is not None else 0)
            args = (args[0], probe.rngs(*call) if probe is not None else None)
        if probe is None:
            return fn(*args, **kwargs)
        k = self.position
        if not probe.timed:  # a run that is not profiled: its total time is the load's
            try:
                return fn(*args, **kwargs)
            except BaseException:
                probe.failed = k
                raise
            finally:
                probe.calls[k] += 1
        measure = probe.measure
        sig_in = shape_in = None
        if measure is not None and args:
            size_in, sig_in, shape_in = measure(args[0])
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
            probe.bytes_out[k], sig_out, shape_out = measure(out)
            probe.changed[k] = sig_in is not None and sig_out != sig_in
            probe.reshaped[k] = shape_in is not None and shape_out != shape_in
        return out


_TIMED_CLASSES: dict[type, type[Timed]] = {}
"""The user's transform class -> the :class:`Timed` subclass named after it (one per class a
Compose holds; classes are few)."""


def timed(fn: Any, position: int) -> Timed:
    """``fn`` wrapped as transform ``position`` of its Compose: a :class:`Timed` subclass with
    the name of ``fn``'s class."""
    user = type(fn)
    try:
        cls = _TIMED_CLASSES.get(user)
        if cls is None:
            cls = _TIMED_CLASSES[user] = type(
                user.__name__, (Timed,), {"__qualname__": user.__qualname__, "__slots__": ()})
    except TypeError:  # a class its metaclass made unhashable: the plain wrapper
        cls = Timed
    return cls(fn, position)


def _original(fn: Any) -> Any:
    """What a copied or unpickled :class:`Timed` becomes: its transform (copied as ever)."""
    return fn


def unwrapped(t: Any) -> Any:
    """``t``'s transform where ``t`` is a :class:`Timed` (its real type, not its
    ``__class__``), else ``t``."""
    return t.fn if Timed in type(t).__mro__ else t
