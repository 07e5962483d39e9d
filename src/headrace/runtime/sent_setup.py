"""A worker's setup on its way to a spawned worker process, rebuilt where the worker can say
what it could not rebuild.

Under the ``spawn`` and ``forkserver`` start methods multiprocessing pickles a worker's
arguments and the new process unpickles them before any of the worker's code runs. A dataset
whose class the new process cannot import (defined in ``__main__`` of ``python -c`` or a
notebook, in a module that is not on its path, or under the script's ``__main__`` guard) ended
the process there, exit code 1, its traceback on stderr only; the training process, left to
guess, blamed a missing ``if __name__ == '__main__':`` guard. torch's loader says no more
("DataLoader worker (pid ...) exited unexpectedly with exit code 1"). Now the setup travels as
bytes, pickled while multiprocessing pickles the process (so what may be shared only while a
process is spawned, a lock or a queue, still pickles: :class:`SentSetup`), and the worker
unpickles them itself (:meth:`ReceivedSetup.load`): what fails is reported as its start's error
(``init_error``, ``runtime/worker.py``), naming the class, its module and the import error.
"""

from __future__ import annotations

import io
import pickle
import sys
from multiprocessing.reduction import ForkingPickler
from typing import Any


class SentSetup:
    """``setup`` (a ``worker.WorkerSetup``) and ``shared`` (the worker's arguments it shares
    with its pool, in order) to be sent to a worker of start method ``method`` (``"spawn"``,
    ``"forkserver"``): pickled together when the worker's process is, and arriving there as a
    :class:`ReceivedSetup`, not yet unpickled."""

    def __init__(self, setup: Any, shared: tuple[Any, ...], method: str) -> None:
        self.setup = setup
        self.shared = shared
        self.method = method

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        buf = io.BytesIO()
        ForkingPickler(buf).dump((self.setup, self.shared))  # one pickle: each fd passed once
        data = buf.getvalue()  # (no copy: the buffer is not written again)
        return ReceivedSetup, (self.setup.slot, self.setup.parent_pid, self.method, data)


class SetupNotRebuilt(Exception):
    """A worker could not unpickle its setup; ``cause``: what unpickling raised."""

    def __init__(self, message: str, cause: BaseException) -> None:
        super().__init__(message)
        self.cause = cause


class ReceivedSetup:
    """A worker's setup as it arrives: its pickled bytes (``SentSetup``), held until
    :meth:`load` takes them. The worker's ``Process`` keeps its arguments, this object among
    them, for its whole life: bytes left here cost a spawned worker its dataset's size again
    (a 200 MiB array: USS 550 MiB, not 351)."""

    __slots__ = ("_data", "method", "parent_pid", "slot")

    def __init__(self, slot: int, parent_pid: int, method: str, data: bytes) -> None:
        self.slot = slot
        self.parent_pid = parent_pid
        self.method = method
        self._data: bytes | None = data

    def __repr__(self) -> str:
        held = "taken" if self._data is None else f"{len(self._data)} bytes"
        return f"ReceivedSetup(slot={self.slot}, method={self.method!r}, {held})"

    def load(self) -> tuple[Any, tuple[Any, ...]]:
        """The ``WorkerSetup`` and the shared arguments sent with it, once (the bytes are let
        go of: a second call raises ``RuntimeError``); raises :class:`SetupNotRebuilt` saying
        what could not be rebuilt."""
        data, self._data = self._data, None
        if data is None:
            raise RuntimeError("this worker's setup was already unpickled")
        loader = _Loader(io.BytesIO(data))
        del data  # the stream's reference is the last: gone with it when this returns
        try:
            return loader.load()
        except Exception as e:  # noqa: BLE001 - said, with its cause, to the training process
            raise SetupNotRebuilt(why_not_rebuilt(e, loader.failed, self.method), e) from e


class _Loader(pickle.Unpickler):
    """Unpickles as ``pickle.loads`` does, noting the (module, name) it could not find."""

    failed: tuple[str, str] | None = None

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except Exception:
            self.failed = (module, name)
            raise


def why_not_rebuilt(e: BaseException, failed: tuple[str, str] | None, method: str) -> str:
    """What to tell the user when a worker of start method ``method`` could not unpickle its
    setup (the dataset, its pipeline, ``worker_init_fn``): ``e``, what unpickling raised;
    ``failed``, the (module, name) it could not import, if that was the failure. Run in the
    worker, where ``sys.modules['__main__']`` is the worker's own."""
    head = (f"the worker could not rebuild what it was sent (the dataset, its steps, "
            f"worker_init_fn): {e}. A {method!r} worker is a new interpreter that imports "
            "every class and function by its module and name")
    if failed is None:
        return f"{head}; this failed unpickling them, not importing them"
    module, name = failed
    if module in ("__main__", "__mp_main__"):
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if main_file is None:
            return (f"{head}: {name!r} is defined in __main__ of a program that has no file "
                    "(`python -c`, a notebook, standard input), which a worker cannot import. "
                    "Define it in a module the worker can import, or pass "
                    "multiprocessing_context='fork'")
        return (f"{head}: {name!r} is not at the top level of {main_file}. The worker imports "
                "that script as a module, without what `if __name__ == '__main__':` guards "
                "or creates at run time; define it at the script's top level or in a module")
    if isinstance(e, ModuleNotFoundError) and e.name == module:
        return (f"{head}: module {module!r}, where {name!r} is defined, is not found in the "
                "worker (not on its sys.path, or made at run time); install it or put its "
                "folder on PYTHONPATH")
    if module not in sys.modules:
        return (f"{head}: importing module {module!r}, where {name!r} is defined, failed in "
                "the worker with the error above (see the traceback)")
    return (f"{head}: module {module!r} has no top-level {name!r} when the worker imports it "
            "(made at run time?); define it at the module's top level")
