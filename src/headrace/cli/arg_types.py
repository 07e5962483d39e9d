"""argparse types for the ``headrace`` subcommands' numeric flags.

A bad value becomes argparse's usage error (exit status 2) naming the flag, e.g. ``argument
--epochs: must be at least 2, got 1 (...)``, instead of reaching the library and ending in its
traceback (``--workers 0``: torch's prefetch_factor error; ``demo --steps 0``: a division by
zero). Every failure raises :class:`argparse.ArgumentTypeError`, so a non-number reads
``'abc' is not an integer`` rather than argparse's fallback, which names the type function.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return x


def int_at_least(low: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low``; ``why`` (e.g. "epoch 1 only fills
    the cache") is appended to the error message."""
    suffix = f" ({why})" if why else ""

    def parse(text: str) -> int:
        n = _int(text)
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {n}{suffix}")
        return n

    parse.__name__ = f"int_at_least_{low}"
    return parse


positive_int = int_at_least(1)
"""An argparse type: an integer of at least 1 (a count of samples, epochs, steps, workers)."""

non_negative_int = int_at_least(0)
"""An argparse type: an integer of at least 0 (where 0 has a meaning, e.g. ``--blas-threads 0``:
the library's default thread count)."""


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (a scale factor, a period in seconds)."""
    x = _float(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return x


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number of at least 0 (a factor on simulated step times,
    where 0 means no simulated time)."""
    x = _float(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return x
