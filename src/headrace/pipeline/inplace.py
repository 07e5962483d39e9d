"""A dataset's Compose-like transform, profiled step by step where the dataset calls it.

A user's ``__getitem__`` may call ``self.transform(x)`` unconditionally, post-process after it,
apply it to two views or to something other than element 0 of its sample. Splitting the
transform out of the dataset would change what ``__getitem__`` computes. Instead headrace runs
the user's dataset object itself, and its Compose-like object itself (no copy of either:
changes the user makes later, such as ``ds.epoch = e``, ``ds.transform = other``,
``ds.transform.offset = k`` or ``DS.transform = other`` on the class, what ``__getstate__``
would drop, what a ``worker_init_fn`` sets on ``get_worker_info().dataset`` and what
``__getitem__`` or the Compose's ``__call__`` write to ``self`` are all seen, as with torch's
loader). For the duration of each ``dataset[i]``, :class:`EmbeddedSource` sets the
``transforms`` attribute of the Compose the dataset has *now* to a list of :class:`Timed`
wrappers of the same transforms, and puts the user's list object back afterwards (deleting the
attribute instead where the Compose read it from its class): the Compose's own ``__call__``
runs, each wrapper calls the original transform with the same arguments and returns its result
unchanged, and measures it for the profiler (on the runs the worker profiles; on the others it
only counts calls and notes a failure). In a worker process the wrappers stay installed
between calls (:class:`EmbeddedSource`). The dataset's attributes are never written, the
user's transform objects are never modified, nothing is set to ``None``, and the result is the
same, value for value, as the dataset run by itself (tested against torch's loader).

The measurements go to the :class:`Probe` the sample runner installs in this thread for the
duration of one ``load`` (:class:`Probing`); outside of it the wrappers only call through
(``pipeline/timed.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from headrace.pipeline.source import DatasetSource, user_attr
from headrace.pipeline.timed import Timed, timed, unwrapped


def carry_changes(installed: Any, wrappers: tuple[Any, ...], parts: Any) -> bool:
    """Write into the user's list ``parts`` what was done in place to the ``installed``
    wrappers' list while it stood in its place (by ``__getitem__``, the Compose, the training
    loop under worker threads), ``wrappers`` being what was installed: an appended, removed or
    replaced transform reaches the user's list object, unwrapped. They were lost when the
    user's list was put back. A tuple cannot change in place: nothing to carry. True: a
    change was carried (the wrappers' list is then not the one to install again)."""
    if not isinstance(parts, list) or not isinstance(installed, list):
        return False
    if len(installed) == len(wrappers) and all(a is b for a, b in zip(installed, wrappers, strict=True)):
        return False  # unchanged (the usual case)
    parts[:] = [unwrapped(t) for t in installed]
    return True


def compose_parts(tf: Any) -> list[Any] | None:
    """The ``transforms`` list of a Compose-like callable ``tf``, else None. A list holding
    anything but callables (``(fn, p)`` pairs, method names, settings) is the Compose's own
    data, not transforms to measure: None too, and the dataset runs as it is."""
    parts = user_attr(tf, "transforms")
    if tf is not None and callable(tf) and isinstance(parts, (list, tuple)) and parts \
            and all(callable(t) for t in parts):
        return list(parts)
    return None


def transform_list(dataset: Any) -> list[Any] | None:
    """The ``transform.transforms`` list of a dataset with a Compose-like transform, else None."""
    return compose_parts(user_attr(dataset, "transform"))


def instrumented(tf: Any) -> Any | None:
    """The ``transforms`` of the Compose-like ``tf`` as :class:`Timed` wrappers, in a container
    of the list's own type, or ``None`` when ``tf`` is not Compose-like or that container cannot
    be built. ``tf`` itself is not modified."""
    parts = compose_parts(tf)
    if parts is None:
        return None
    try:
        return type(tf.transforms)([timed(t, k) for k, t in enumerate(parts)])
    except Exception:  # noqa: BLE001 - a container that cannot be rebuilt: leave it alone
        return None


def held(tf: Any) -> bool:
    """Whether ``tf`` holds its ``transforms`` itself (its ``__dict__``, a slot, a property)
    rather than reading its class's attribute (or its ``__getattr__``): what is put back is then
    set, else the attribute the wrappers were set as is deleted, so that no instance attribute
    is left that the user's object did not have and a later change to the class is seen."""
    own = user_attr(tf, "__dict__")
    if own is None or "transforms" in own:
        return True
    for k in type(tf).__mro__:
        if "transforms" in vars(k):
            return hasattr(type(vars(k)["transforms"]), "__set__")
    return False


def put_back(tf: Any, parts: Any, own: bool) -> None:
    """Give the Compose ``tf`` its ``transforms`` ``parts`` again (``own``: :func:`held`)."""
    if own:
        tf.transforms = parts
    else:
        del tf.transforms


def swappable(dataset: Any) -> bool:
    """Whether the ``transforms`` of the dataset's Compose-like transform can be set to
    wrappers and back: tried once on the user's Compose (set, then restored at once). A
    ``transform`` that is another object at each read, or ``transforms`` that a property,
    ``__slots__`` or ``__setattr__`` refuses or alters, makes it False."""
    tf = user_attr(dataset, "transform")
    wrapped = instrumented(tf)
    if wrapped is None or user_attr(dataset, "transform") is not tf:
        return False
    parts, own = tf.transforms, held(tf)
    took = False
    try:
        tf.transforms = wrapped
        took = user_attr(tf, "transforms") is wrapped
    except Exception:  # noqa: BLE001 - the assignment is refused: the dataset stays opaque
        return False
    finally:
        if user_attr(tf, "transforms") is not parts:
            with contextlib.suppress(Exception):
                put_back(tf, parts, own)
    return took and user_attr(tf, "transforms") is parts and held(tf) == own


class EmbeddedSource(DatasetSource):
    """``load(i) = dataset[i]`` on the user's own dataset, its Compose-like transform measured.

    ``steps``: the number of transforms named at construction (``Pipeline.steps``); a transform
    with another number of transforms, or one no longer Compose-like, runs as it is, unmeasured
    (the runner then reports zero time for each transform, as for a dataset that never calls
    its transform).

    For each call, the ``transforms`` of the Compose the dataset has *now* are set to their
    wrappers (:func:`instrumented`, cached while the Compose's list and its items stay the same)
    and put back once no call is in flight. The Compose itself is the user's object, not a copy:
    an attribute the user changes between epochs (a curriculum knob, MONAI's
    ``set_random_state``) is the one the next call reads, and what the Compose writes to itself
    while it runs (a call counter) lands on the user's object, as with torch's loader at
    ``num_workers=0``; a cached copy of the Compose, refreshed only when the Compose or its list
    was replaced, ran every epoch with the first epoch's attributes. Worker threads
    (``Options(executor="threads")``) share one dataset: a counter of the calls in flight,
    guarded by a lock held only around the swap (never during ``dataset[i]``), makes the first
    call install the wrappers and the last one restore the user's list. Calls in between run on
    the installed wrappers, so every thread's transforms are measured (each :class:`Timed`
    reports to the probe of the thread that calls it) and a random headrace ``Step`` always gets
    its rng; swapping per call instead would let one thread restore the user's list under
    another, or save the installed wrappers as "the original". If ``transforms`` is found
    changed at the end (the Compose, ``__getitem__`` or the user assigned it), the new value is
    left in place, any wrappers in it unwrapped (a slice of the wrappers' list); a change made
    in place to the wrappers' list is carried into the user's list before it is put back
    (:func:`carry_changes`: an appended or removed transform was lost). The lock and the cache
    are not pickled: a worker process builds its own.

    In a worker process (any process but the one that made this source) the wrappers stay
    installed between calls: the dataset there is the worker's own, which only the worker's
    code sees, and the swap and restore cost about 5 µs a sample. A Compose the dataset is found
    with whose list is not the installed one (``__getitem__`` or ``worker_init_fn`` assigned a
    transform, or a list) gets its own wrappers at the next call, as in the training process.
    """

    def __init__(self, dataset: Any, steps: int, owner_pid: int | None = None) -> None:
        super().__init__(dataset)
        self.steps = steps
        self._owner_pid = os.getpid() if owner_pid is None else owner_pid
        self._lock = threading.Lock()
        self._in_flight = 0  # calls of load() between their swap and their restore
        self._compose: Any = None  # the user's Compose whose list is installed, or None
        self._parts: Any = None  # the user's list (or tuple) to give it back
        self._own = True  # held(): put back by setting the list, else by deleting the attribute
        self._installed: Any = None  # the wrappers set as its transforms, or None
        self._wrappers: tuple[Any, ...] = ()  # what ``_installed`` held when it was set
        self._cache: tuple[Any, list[Any], Any, tuple[Any, ...]] | None = None
        """(user's list, its items, wrappers, the wrappers as made: what carry_changes compares
        the installed list with, taken once, not at every sample)"""

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "steps": self.steps, "owner_pid": self._owner_pid}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"], state["steps"],  # type: ignore[misc]
                      state.get("owner_pid"))

    def _install(self, tf: Any) -> bool:
        """Set the wrappers of ``tf``'s transforms on it, unless they are another loader's
        (False: run on those, and leave the restore to that loader); called under the lock."""
        parts = compose_parts(tf)
        if parts is None or len(parts) != self.steps:
            return True  # runs unmeasured
        if isinstance(parts[0], Timed):
            return False  # another loader over this dataset (or Compose) installed its wrappers
        user = tf.transforms
        c = self._cache
        if c is None or c[0] is not user or any(a is not b for a, b in zip(c[1], parts, strict=True)):
            wrappers = instrumented(tf)
            self._cache = c = (user, parts, wrappers, tuple(wrappers or ()))
        if c[2] is not None:
            self._compose, self._parts, self._own, self._installed = tf, user, held(tf), c[2]
            self._wrappers = c[3]
            tf.transforms = c[2]
        return True

    def _restore(self) -> None:
        """Give the Compose its list back, if the wrappers are still there; under the lock."""
        tf, self._compose = self._compose, None
        if tf is not None:
            now = user_attr(tf, "transforms")
            if now is self._installed:
                if carry_changes(self._installed, self._wrappers, self._parts):
                    self._cache = None  # its wrappers' list holds the change
                put_back(tf, self._parts, self._own)
            elif isinstance(now, list) and any(unwrapped(t) is not t for t in now):
                now[:] = [unwrapped(t) for t in now]  # a list assigned from the wrappers'
                # (``self.transforms = self.transforms[:2]``): it stays, without them
        self._parts = self._installed = None
        self._wrappers = ()

    def load(self, index: int) -> Any:
        ds = self.dataset
        if os.getpid() != self._owner_pid:  # a worker process: install once, never restore
            tf = user_attr(ds, "transform")
            if self._installed is None or user_attr(tf, "transforms") is not self._installed:
                self._compose = None
                self._install(tf)
            return ds[index]
        with self._lock:
            tf = user_attr(ds, "transform")
            if self._installed is not None and user_attr(tf, "transforms") is self._installed:
                ours = True  # installed by a call still in flight
            else:  # the first call, or the transform or its list reassigned meanwhile
                self._restore()
                ours = self._install(tf)
            if ours:
                self._in_flight += 1
        if not ours:
            return ds[index]
        try:
            return ds[index]
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._restore()
