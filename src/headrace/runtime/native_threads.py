"""Native thread pools of a worker process: OpenBLAS (NumPy's and SciPy's BLAS) and OpenMP.

NumPy's OpenBLAS starts one thread per core in every process, and its threads spin while they
wait for work. With a dozen loader workers on a 2-core machine, each worker's matrix products
(speech's mel filterbank) fan out to threads that burn the cores the other workers need:
measured here, 5 worker processes on the speech-3s pipeline used 31.5 CPU-seconds in a 16.7 s
epoch whose steps needed 4.6 (1.9 of the 2 cores), 3.4 CPU-seconds with one BLAS thread per
worker, and the epoch took 14.3 s instead. torch's DataLoader sets torch's own intra-op pool to
one thread in its workers and leaves BLAS alone; headrace's worker processes do both
(``Options(worker_blas_threads=1)``, the default, :func:`limit_in_worker`): the workers are the
parallelism. The thread count can change the last bits of BLAS results (measured here: a
400x513 by 513x80 product and a dot over 2M elements differ between 1 and 2 threads; the
speech pipeline's samples did not), as it does between machines with different core counts
and as torch's own one-thread pool does for torch operations in workers; sample contents
never depend on which worker ran them, since every worker runs the same count.
``worker_blas_threads=None`` keeps the inherited count (torch's DataLoader's behaviour).

The training process is never changed by the loader; the benchmark harness limits it too (for
the rows of torch's DataLoader, whose forked workers inherit the setting) with
:func:`blas_limited`. ``threadpoolctl`` does the same more generally; this avoids a dependency
for two calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
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
_PARALLEL = (
    "scipy_openblas_get_parallel64_",
    "scipy_openblas_get_parallel",
    "openblas_get_parallel64_",
    "openblas_get_parallel",
)
"""How the library was built: 0 sequential, 1 its own threads (pthreads), 2 OpenMP."""
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


POOL_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Variables native libraries read when they load: set in a worker for the ones it loads later."""


_resolved: tuple[int, list[tuple[Any, Any]]] | None = None
"""(pid, :func:`_openblas_counts`) found by that process inside :func:`resolved_for_fork`, for
the workers it forks meanwhile."""


def _openblas_counts() -> list[tuple[Any, ctypes.c_int | None]]:
    """Every loaded OpenBLAS's thread-count setter, with its ``blas_cpu_number`` (the threads a
    call may use) where the library exports that variable and runs its own threads, else None
    (an OpenMP build reads OpenMP's count at each call, and only its setter changes that)."""
    found = []
    for path in _loaded_openblas():
        lib = ctypes.CDLL(path)
        set_threads = _function(lib, _SETTERS)
        if set_threads is None:
            continue
        count: ctypes.c_int | None = None
        parallel = _function(lib, _PARALLEL)
        if parallel is not None:
            parallel.restype = ctypes.c_int
            if parallel() == 1:
                try:
                    count = ctypes.c_int.in_dll(lib, "blas_cpu_number")
                except ValueError:
                    pass
        found.append((set_threads, count))
    return found


@contextlib.contextmanager
def resolved_for_fork() -> Iterator[None]:
    """In the training process, around forking a pool's workers: find the loaded OpenBLAS
    libraries once, so that each forked worker's :func:`limit_in_worker` does not read its
    memory map again (4-32 ms a worker on a 16-core machine whose torch maps hundreds of
    libraries, while the pool's next workers fork)."""
    global _resolved
    _resolved = (os.getpid(), _openblas_counts())
    try:
        yield
    finally:
        _resolved = None  # a worker forked later looks itself: libraries may have come since


def limit_in_worker(n: int) -> None:
    """In a worker process: every OpenBLAS already loaded runs ``n`` threads, and libraries
    loaded later start with ``n`` (the variables of :data:`POOL_ENV`). Never call it in the
    training process: it changes the process's environment.

    For one thread, OpenBLAS's count is written, not set through ``openblas_set_num_threads``:
    OpenBLAS stops its thread pool before every fork, and that setter first starts it again in
    the child, a thread per core but one, each with its buffers, in every worker, only for them
    to wait unused (docs/design.md). A call that finds the count at 1 runs on the calling
    thread and never starts the pool."""
    for name in POOL_ENV:
        os.environ[name] = str(n)
    resolved = _resolved
    found = resolved[1] if resolved is not None and resolved[0] == os.getppid() else _openblas_counts()
    for set_threads, count in found:
        if n == 1 and count is not None:
            count.value = 1
        else:
            set_threads.restype = None
            set_threads(ctypes.c_int(n))


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
