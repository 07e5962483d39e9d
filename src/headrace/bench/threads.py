"""Limiting NumPy's BLAS thread pool for a benchmark run (Linux, OpenBLAS).

NumPy's OpenBLAS starts one thread per core in every process. With a dozen loader workers on a
2-core machine, each worker's matrix products (speech's mel filterbank) fan out to threads that
spin while waiting, and the run measures that oversubscription instead of the loaders: on this
machine the speech workloads burned about 3× the CPU-seconds with the default pool. torch's
DataLoader and headrace both set torch's own pool to one thread in workers, but neither touches
OpenBLAS, so the harness does it once in the training process before any worker is forked
(forked workers inherit the setting). ``threadpoolctl`` does the same more generally; this
avoids a dependency for one call.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_SETTERS = (
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "openblas_set_num_threads",
)
_GETTERS = (
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
    "openblas_get_num_threads64_",
    "openblas_get_num_threads",
)


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (empty off Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted(set(re.findall(r"(/\S*openblas\S*\.so[\w.\-]*)", maps)))


def _function(lib: ctypes.CDLL, names: tuple[str, ...]) -> Any:
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def blas_threads() -> dict[str, int]:
    """Current thread count of every loaded OpenBLAS, by library file name."""
    out: dict[str, int] = {}
    for path in _loaded_openblas():
        get = _function(ctypes.CDLL(path), _GETTERS)
        if get is not None:
            get.restype = ctypes.c_int
            out[Path(path).name] = int(get())
    return out


def limit_blas_threads(n: int | dict[str, int]) -> dict[str, int]:
    """Set every loaded OpenBLAS to ``n`` threads; returns the new counts (empty: none found).

    ``n`` may be a mapping from library file name to count, as :func:`blas_threads` returns
    (to restore earlier settings). Call it in the training process before loaders fork.
    """
    import numpy  # noqa: F401 - make sure NumPy's OpenBLAS is loaded

    for path in _loaded_openblas():
        count = n.get(Path(path).name) if isinstance(n, dict) else n
        set_threads = _function(ctypes.CDLL(path), _SETTERS)
        if set_threads is not None and count is not None:
            set_threads.restype = None
            set_threads(ctypes.c_int(count))
    return blas_threads()


@contextlib.contextmanager
def blas_limited(n: int) -> Iterator[dict[str, int]]:
    """Within the block every loaded OpenBLAS runs ``n`` threads (``n <= 0``: unchanged)."""
    before = blas_threads()
    if n <= 0:
        yield before
        return
    try:
        yield limit_blas_threads(n)
    finally:
        limit_blas_threads(before)
