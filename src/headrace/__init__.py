"""headrace: a drop-in torch DataLoader that measures the input pipeline and keeps accelerators fed."""

from headrace import sources
from headrace.cache.config import Cache
from headrace.errors import (
    HeadraceError,
    IterablePositionWarning,
    LoaderClosedError,
    PipelineError,
    RemoteUnavailableError,
    ReplayOrderWarning,
    StateDictError,
    StepError,
    UnevenRanksError,
    WorkerDiedError,
)
from headrace.pipeline import Pipeline, Step, step
from headrace.planner.timeout import TimeoutConfig
from headrace.planner.workers import AutoscaleConfig
from headrace.remote.config import Remote
from headrace.remote.storage import NearStorage
from headrace.runtime import DataLoader, Options
from headrace.telemetry.stats import CacheStats, EpochStats, LoaderStats

__version__ = "0.1.0"


def get_worker_info():  # noqa: ANN201 - same object as torch returns
    """Inside a headrace worker: torch's WorkerInfo (id, num_workers, seed, dataset); else None."""
    from torch.utils.data import get_worker_info as _torch_get_worker_info

    return _torch_get_worker_info()

__all__ = [
    "AutoscaleConfig",
    "Cache",
    "CacheStats",
    "DataLoader",
    "EpochStats",
    "HeadraceError",
    "IterablePositionWarning",
    "LoaderClosedError",
    "LoaderStats",
    "NearStorage",
    "Options",
    "Pipeline",
    "PipelineError",
    "Remote",
    "RemoteUnavailableError",
    "ReplayOrderWarning",
    "StateDictError",
    "Step",
    "StepError",
    "TimeoutConfig",
    "UnevenRanksError",
    "WorkerDiedError",
    "get_worker_info",
    "sources",
    "step",
]
