"""Making a process look like one of torch's worker processes to the user's code: its global
generators seeded as torch's worker loop seeds them, ``get_worker_info()`` answering, then
``worker_init_fn``. Shared by local worker processes (``runtime/worker.py``) and remote workers
(``remote/actor.py``). In a pool that probes for ``executor="auto"``, also the watch on the
steps' calls of ``get_worker_info()`` (:func:`watch_worker_info_reads`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from headrace.runtime.worker import WorkerSetup


def init_as_torch_worker(setup: WorkerSetup, progress: Any = None) -> tuple[str, ...]:
    """Make this process look like one of torch's workers to the user's code, as torch's worker
    loop does: the global generators seeded from ``base_seed + slot``, ``get_worker_info()``
    answering (id ``slot``, ``num_workers``, that seed, ``dataset``), then
    ``worker_init_fn(slot)``. Shared by local worker processes and remote workers
    (``remote/actor.py``). Returns the global generators ``worker_init_fn`` seeded (not merely
    drew from), which per-sample seeding overrides (``_reseeded``). ``progress``: the pool's
    ``handles.Progress`` (a local worker process): where a probing worker
    (``setup.probe_gil``) notes a step's first call of ``get_worker_info()``."""
    slot = setup.slot
    seed = setup.base_seed + slot
    _seed_like_torch(setup.base_seed, slot, seed)
    _set_worker_info(slot, setup.num_workers, seed, setup.dataset)
    reseeded: tuple[str, ...] = ()
    if setup.worker_init_fn is not None:
        before = _global_states()
        setup.worker_init_fn(slot)
        reseeded = _reseeded(before, _global_states())
    if setup.probe_gil and progress is not None:
        watch_worker_info_reads(progress.worker_info_read, progress.step, slot)
    return reseeded


def _seed_like_torch(base_seed: int, worker_id: int, seed: int) -> None:
    """Seed the worker's global generators as torch's worker loop does (before worker_init_fn)."""
    import random

    import numpy as np
    from torch.utils.data._utils.worker import _generate_state

    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(_generate_state(base_seed, worker_id))


def _global_states() -> tuple[Any, Any, int]:
    import random

    import numpy as np

    return random.getstate(), np.random.get_state(legacy=False), torch.initial_seed()


def _reseeded(before: tuple[Any, Any, int], after: tuple[Any, Any, int]) -> tuple[str, ...]:
    """The global generators ``worker_init_fn`` seeded (not merely drew from): torch's initial
    seed changed; Python's or NumPy's state changed and sits at a freshly seeded position
    (Mersenne Twister: 624, where drawing would have moved it). NumPy's global bit generator
    may be another than its Mersenne Twister (``np.random.set_bit_generator``): a seed cannot
    be told from a draw there, and none is reported."""
    out = []
    if after[0] != before[0] and after[0][1][-1] == 624:
        out.append("random")
    b, a = before[1], after[1]
    if (a["bit_generator"] == b["bit_generator"] == "MT19937"
            and not np.array_equal(a["state"]["key"], b["state"]["key"])
            and a["state"]["pos"] == 624):
        out.append("numpy")
    if after[2] != before[2]:
        out.append("torch")
    return tuple(out)


def _set_worker_info(slot: int, num_workers: int, seed: int, dataset: Any) -> None:
    """Make ``torch.utils.data.get_worker_info()`` answer inside headrace workers."""
    from torch.utils.data._utils import worker as tw

    tw._worker_info = tw.WorkerInfo(id=slot, num_workers=num_workers, seed=seed, dataset=dataset)


def watch_worker_info_reads(reads: Any, steps: Any, slot: int) -> None:
    """Note in ``reads[slot]`` 1 + the step (``steps[slot]``: the one this worker runs) that
    first calls ``torch.utils.data.get_worker_info()`` in this process (headrace's calls it):
    worker threads would see ``None`` there (torch keeps one ``WorkerInfo`` per process, a
    module global), so ``executor="auto"`` keeps such a pipeline on processes
    (``runtime/executor_auto.py``). Every caller holds the one function object (``from
    torch.utils.data import get_worker_info`` binds it at import), so its code is swapped for
    :func:`_noting_get_worker_info`, which returns what torch's returns, and put back at the
    first call: from then on, and in a process whose steps never call it, the watch costs
    nothing. A probing worker process only: the training process's function is never touched.
    Calls from torch's own data utilities are not the step's: ``default_collate`` asks it only
    to choose where to allocate (a step stacking crops with it was kept on processes, named
    as calling ``get_worker_info()``, by a review); they are let through, watched on (a frame
    read, about a microsecond a call, in the probing epoch only)."""
    import sys

    from torch.utils.data._utils import worker as tw

    fn = tw.get_worker_info
    original = fn.__code__

    def noted() -> None:
        # the caller of get_worker_info: two frames up (this, then its swapped code)
        if sys._getframe(2).f_globals.get("__name__", "").startswith("torch.utils.data."):
            return
        fn.__code__ = original
        if not reads[slot]:
            reads[slot] = steps[slot] + 1

    tw.__dict__["_headrace_noted"] = noted
    fn.__code__ = _noting_get_worker_info.__code__


def _noting_get_worker_info() -> Any:
    """The code that torch's ``get_worker_info`` runs while watched
    (:func:`watch_worker_info_reads`). It runs with that function's globals, torch's module's:
    ``_worker_info`` is torch's, ``_headrace_noted`` the watch's."""
    _headrace_noted()  # type: ignore[name-defined]  # noqa: F821
    return _worker_info  # type: ignore[name-defined]  # noqa: F821
