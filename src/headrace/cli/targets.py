"""What ``SCRIPT_OR_WORKLOAD`` names for ``headrace profile`` and ``headrace plan``: a workload
(``headrace.workloads.WORKLOADS``, built with the samples asked for) or a user's script.

Script protocol: the script is imported as a module named after its file (its directory goes on
``sys.path`` so worker processes can import it too; ``if __name__ == "__main__":`` blocks do not
run). At module level it defines ``pipeline`` (a :class:`headrace.Pipeline`) or ``dataset`` (a
map-style dataset; a Compose-like ``transform`` is split into steps); optionally ``batch_size``
(default 32), ``num_workers`` (default 2) and ``collate_fn``, as for ``headrace.DataLoader``; and
optionally ``train_step(batch)``, one training iteration, used for the input-bound vs
accelerator-bound verdict (skipped without it). A workload's consumer sleeps its
``accelerator_step_s`` per batch instead.

A target that is neither, or a script that breaks the protocol, raises :class:`TargetError`
(the commands print its one line, status 2); an exception of the script's own, raised while it
is imported, is :class:`ScriptFailed`'s cause, with the script's traceback (status 1).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

DEFAULT_BATCH_SIZE = 32
"""Batch size of a script that does not define ``batch_size``."""
DEFAULT_WORKERS = 2
"""Worker processes for a script that does not define ``num_workers``."""


class TargetError(ValueError):
    """``SCRIPT_OR_WORKLOAD`` cannot be run: neither a script nor a workload, or a script that
    breaks the protocol (module docstring). The message says what to change; the command
    prints it on one line and exits with status 2. An exception the user's script raises
    itself is never one: it keeps its type and traceback (:class:`ScriptFailed`)."""


class ScriptFailed(Exception):
    """The user's script raised ``__cause__`` while being imported. Its traceback starts at
    the script's own frame (headrace's and importlib's frames removed), so printing
    ``__cause__`` shows what ``python script.py`` shows."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What to run: ``dataset`` (a Pipeline or map-style dataset), the ``DataLoader`` arguments,
    ``train_step(batch)`` (``None``: no verdict); ``name`` names the output files."""

    name: str
    dataset: Any
    batch_size: int
    num_workers: int | str  # or "auto"
    collate_fn: Callable[[Any], Any] | None
    train_step: Callable[[Any], Any] | None
    description: str


def load_target(spec: str, *, samples: int, time_scale: float = 0.1,
                cache_dir: str | None = None, seed: int = 0) -> Target:
    """A workload by name (built with ``samples`` samples) or a script by path.

    Raises :class:`TargetError` with what to do when ``spec`` is neither, or the script breaks
    the protocol (module docstring); :class:`ScriptFailed` when the script raises on import.
    """
    from headrace.workloads import WORKLOADS, get_workload

    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise TargetError(f"no script at {spec}")
        return _script_target(load_script(path))
    if spec not in WORKLOADS:
        raise TargetError(f"{spec!r} is neither a Python script nor a workload "
                         f"({', '.join(WORKLOADS)})")
    try:
        w = get_workload(spec, num_samples=samples, time_scale=time_scale, seed=seed,
                         cache_dir=cache_dir)
    except ValueError as e:  # a workload's own check of these arguments
        raise TargetError(f"{spec}: {e}") from None
    step_s = w.accelerator_step_s
    return Target(w.name, w.pipeline, w.batch_size, w.num_workers, None,
                  lambda _batch: time.sleep(step_s),
                  f"{w.description} (consumer: a {step_s * 1e3:g} ms sleep per batch)")


def load_script(path: str | Path) -> ModuleType:
    """Import the script at ``path`` as a module named after it, not as ``__main__``.

    Its directory is put first on ``sys.path`` so that spawned worker processes can import it
    (its functions are pickled by reference); a name taken by another module gets a prefix.
    An exception the script raises is re-raised as :class:`ScriptFailed` from it (its
    ``__cause__``, traceback from the script's frame on); ``SystemExit`` and
    ``KeyboardInterrupt`` pass as they are, as they would end ``python script.py``.
    """
    p = Path(path).resolve()
    name = p.stem
    taken = sys.modules.get(name)
    if not name.isidentifier() or (taken is not None and getattr(taken, "__file__", None) != str(p)):
        name = "_headrace_script_" + "".join(c if c.isalnum() else "_" for c in p.stem)
    if str(p.parent) not in sys.path:
        sys.path.insert(0, str(p.parent))
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise TargetError(f"cannot import {p} as a Python module")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's own error, of any type (a ValueError included)
        del sys.modules[name]
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != str(p):
            tb = tb.tb_next  # drop this function's frame and importlib's
        # no frame of the script: it did not compile (a SyntaxError names its file and line
        # itself, and python script.py prints no traceback above it)
        e.__traceback__ = tb
        raise ScriptFailed(f"{p} raised while being imported") from e
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _script_target(m: ModuleType) -> Target:
    import headrace as hr

    where = getattr(m, "__file__", m.__name__)
    data = getattr(m, "pipeline", None)
    if data is not None and not isinstance(data, hr.Pipeline):
        raise TargetError(f"{where}: `pipeline` must be a headrace.Pipeline, "
                         f"got {type(data).__name__}")
    if data is None:
        import torch.utils.data as tud

        data = getattr(m, "dataset", None)
        if isinstance(data, tud.IterableDataset):
            raise TargetError(f"{where}: `dataset` is an IterableDataset; profile and plan "
                             "run a subset of samples by index, which needs a map-style "
                             "dataset (__len__ and __getitem__)")
        if data is None or not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise TargetError(f"{where}: define `pipeline` (a headrace.Pipeline) or `dataset` "
                             "(a map-style dataset with __len__ and __getitem__)")
    step = getattr(m, "train_step", None)
    if step is not None and not callable(step):
        raise TargetError(f"{where}: `train_step` must be callable as train_step(batch)")
    return Target(
        name=m.__name__.removeprefix("_headrace_script_"),
        dataset=data,
        batch_size=_count(getattr(m, "batch_size", DEFAULT_BATCH_SIZE), "batch_size", 1, where),
        num_workers=_workers(getattr(m, "num_workers", DEFAULT_WORKERS), where),
        collate_fn=getattr(m, "collate_fn", None),
        train_step=step,
        description=f"script {where}" + ("" if step else " (no train_step)"),
    )


def _workers(value: Any, where: str) -> int | str:
    """A script's ``num_workers``: an integer of at least 0, or ``"auto"`` as the DataLoader
    takes it."""
    if value == "auto":
        return "auto"
    return _count(value, "num_workers", 0, where, " or 'auto'")


def _count(value: Any, name: str, least: int, where: str, other: str = "") -> int:
    """A script's integer setting ``name`` of at least ``least``, else a :class:`TargetError`
    naming it (not int()'s message, nor torch's traceback for a negative one)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = least - 1
    if n < least or isinstance(value, bool):
        raise TargetError(f"{where}: `{name}` must be an integer of at least {least}{other}, "
                          f"got {value!r}")
    return n
