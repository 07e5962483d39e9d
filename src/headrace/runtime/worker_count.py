"""``num_workers`` as a loader keeps it, given at construction or assigned later (torch
honours an assignment at the next ``iter()``): an ``int`` (NumPy's integers too), or
``"auto"`` as an ``options.AutoWorkers`` whose count the worker scaler adapts."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from headrace.runtime import iterable_dataset
from headrace.runtime.options import AutoWorkers, Options

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader


def normalised(num_workers: Any, options: Options, iterable: bool) -> Any:
    """``num_workers`` as a loader keeps it: ``"auto"`` an ``AutoWorkers`` (over an
    ``IterableDataset`` the fixed count torch's iterator runs), NumPy's integers an ``int``;
    anything else as given, for torch's checks and ``loader_arguments.check_arguments``."""
    if isinstance(num_workers, str):
        if num_workers != "auto":
            raise TypeError(  # as torch's DataLoader (its num_workers < 0 check)
                f"num_workers must be an int or 'auto', got the string {num_workers!r}")
        num_workers = AutoWorkers(options.autoscale.start_count())
        if iterable:  # torch's iterator: a fixed count, named in a warning
            num_workers = iterable_dataset.fixed_workers(num_workers)
    elif type(num_workers) is not AutoWorkers and hasattr(num_workers, "__index__"):
        num_workers = operator.index(num_workers)  # NumPy's integers, as torch takes them
    return num_workers


def assigned(loader: DataLoader, value: Any) -> Any:
    """``loader.num_workers = value`` after construction, normalised as at construction: a
    negative count is torch's ``ValueError`` here (headrace failed at ``iter()`` in words about
    arrays; torch asserts there). ``"auto"`` needs a loader built with it, whose monitor has
    the worker scaler: on another it would run a fixed count that ``explain()`` called
    adaptive. A fixed count on a loader built with ``"auto"`` parks the scaler, which resized
    the pool it was told to keep fixed; ``"auto"`` again takes it back."""
    value = normalised(value, loader.options, loader._iterable)
    if not isinstance(value, int):  # (1.5: check_arguments' TypeError at __init__)
        raise TypeError(f"num_workers must be an int or 'auto', got {value!r}")
    if value < 0:
        raise ValueError("num_workers option should be non-negative; use "
                         f"num_workers=0 to disable multiprocessing (got {value})")
    auto = isinstance(value, AutoWorkers)
    if auto and not loader.monitor.can_scale:
        raise ValueError("num_workers='auto' after construction needs a loader built with "
                         "num_workers='auto' (its worker scaler is set up then); pass it to "
                         "DataLoader(...)")
    loader.monitor.follow_auto(auto)
    return value
