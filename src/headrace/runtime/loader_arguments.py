"""The checks of a loader's arguments taken together (torch's keywords and ``Options``), run
when the loader is built, and the generator the loader gives torch
(``runtime/loader.py``)."""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch

from headrace.runtime.options import Options


def loader_generator(options: Options, generator: torch.Generator | None
                     ) -> torch.Generator | None:
    """The generator a loader gives torch: ``generator=`` as given, else one seeded with
    ``Options(seed=)``, else ``None`` (torch's global generator). Both given with other seeds:
    ``generator=`` wins, as torch would use it, and a warning says that ``seed`` is not used.
    Same seed, no warning: a loader rebuilt from its attributes (Lightning's and Accelerate's
    sampler injection) passes back the generator its ``seed`` made, with its ``options``.
    Anything else than a ``torch.Generator`` is a ``TypeError`` here, when the loader is built
    (torch's ``iter()`` raises one from ``random_(generator=...)``; headrace read
    ``initial_seed()`` or ``get_state()`` of it first and raised an ``AttributeError``)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {generator!r} "
                        f"of type {type(generator).__qualname__}")
    if generator is None:
        if options.seed is None:
            return None
        generator = torch.Generator()
        generator.manual_seed(options.seed)
        return generator
    if options.seed is not None and generator.initial_seed() != options.seed % 2**64:
        warnings.warn(
            f"Options(seed={options.seed}) and generator= (seeded with "
            f"{generator.initial_seed()}) were both given: the generator= keyword is the "
            "loader's generator (the shuffle order and the samples' seeds come from it, as in "
            "torch), and seed does not seed it; pass one of them", UserWarning, stacklevel=3)
    return generator


def check_arguments(options: Options, iterable: bool, num_workers: int,
                    worker_init_fn: Any, prefetch_factor: int | None) -> None:
    """Raise ``ValueError`` for a loader's arguments that headrace cannot honour together
    (torch's own checks ran first); ``iterable``: the dataset is an ``IterableDataset``.

    The rule for an ``IterableDataset``: torch's own iterator runs the dataset's ``__iter__``
    and headrace schedules no sample of it, so an option that would act on samples or on where
    they run (``on_error="skip"``, ``sample_timeout_s``, ``executor="threads"``, ``remote``,
    ``device``) is refused when the loader is built rather than silently ignored. ``num_workers="auto"`` is not an
    option of that kind: it becomes the fixed count torch's iterator runs, named in a warning
    (``runtime/iterable_dataset.py``). Options that only tune how samples are scheduled,
    cached or profiled, set to other than their defaults, are not refused (one ``Options`` is
    often shared by a script's loaders) but named in a warning (:func:`unused_by_iterable`).

    ``num_workers`` and, with workers, ``prefetch_factor`` that are not integers (``1.5``,
    ``2.0``) are a ``TypeError`` with torch's words (``'float' object cannot be interpreted as
    an integer``) here, when the loader is built, where torch's ``iter()`` raises it (its
    ``range()`` over them): headrace refused neither (``num_workers=1.5`` failed in ``iter()``
    in words about sequences, ``prefetch_factor=2.5`` read ahead by 2.5 batches)."""
    _check_integer("num_workers", num_workers, "an int or 'auto'")
    if num_workers and prefetch_factor is not None:
        _check_integer("prefetch_factor", prefetch_factor, "an int, batches each worker keeps ahead")
    if iterable and options.on_error != "raise":
        raise ValueError(
            f"Options(on_error={options.on_error!r}) needs a map-style dataset: an "
            "IterableDataset is iterated by torch's own iterator, which runs the dataset's "
            "__iter__; headrace schedules no sample of it to skip (an error there raises in the "
            "training loop, as with torch)")
    if iterable and options.sample_timeout_s is not None:
        raise ValueError(
            "Options(sample_timeout_s=...) needs a map-style dataset: an IterableDataset is "
            "iterated by torch's own iterator, which runs the dataset's __iter__; headrace "
            "times no sample of it (torch's timeout= bounds the wait for a batch from a worker)")
    if iterable:
        unused = unused_by_iterable(options)
        if unused:
            warnings.warn(
                f"Options({', '.join(unused)}): no effect over an IterableDataset: torch's "
                "own iterator runs the dataset's __iter__ and headrace schedules, caches and "
                "profiles none of its samples (those options act on a map-style dataset's "
                "samples)", UserWarning, stacklevel=3)
    if num_workers and prefetch_factor is not None and prefetch_factor < 1:
        raise ValueError(  # torch's iter() asserts it; headrace read ahead as if it were 2
            f"prefetch_factor must be at least 1 with workers (batches each worker keeps "
            f"ahead), got {prefetch_factor}")
    if options.executor == "threads" and num_workers:
        if iterable:
            raise ValueError("Options(executor='threads') needs a map-style dataset; an "
                             "IterableDataset is iterated by torch's own worker processes")
        if worker_init_fn is not None:
            raise ValueError("worker_init_fn needs worker processes; with "
                             "Options(executor='threads') there are none to initialise")
    if options.remote is not None and (iterable or not num_workers):
        raise ValueError("Options(remote=...) needs a map-style dataset and num_workers >= 1 "
                         "(remote workers join the local ones)")


def _check_integer(name: str, value: Any, wanted: str) -> None:
    """Raise torch's ``TypeError`` for an argument ``value`` that is not an integer (an ``int``
    or what has ``__index__``, as ``range()`` takes it), naming the argument ``name`` and what
    it should be (``wanted``)."""
    try:
        operator.index(value)
    except TypeError as e:
        raise TypeError(f"{e} ({name}={value!r}: {wanted})") from None


_SAMPLE_TUNING = ("max_in_flight", "slow_lane_share", "timeout", "max_worker_restarts",
                  "worker_blas_threads", "collate_threads", "cache")
"""Options that tune how a map-style dataset's samples are scheduled, run, collated or cached,
and do nothing over an IterableDataset. Not listed: ``autoscale`` (its ``initial`` is the
fixed count ``num_workers="auto"`` becomes there) and the switches that only turn something
off (``handoff``, ``profile``, ``reorder``, ``profile_store``, and ``cache=None``): off is
what an IterableDataset gets anyway. ``worker_blas_threads=None`` is torch's way too."""


def unused_by_iterable(options: Options) -> list[str]:
    """The names of the :data:`_SAMPLE_TUNING` options ``options`` sets to other than their
    defaults (``cache=None`` and ``worker_blas_threads=None`` left out: they ask for nothing):
    what a warning names when the loader iterates an IterableDataset."""
    default = Options()
    return [name for name in _SAMPLE_TUNING
            if getattr(options, name) is not None
            and getattr(options, name) != getattr(default, name)]
