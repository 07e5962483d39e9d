"""headrace: a drop-in torch DataLoader that measures the input pipeline and keeps accelerators fed."""

from headrace import sources
from headrace.errors import HeadraceError, PipelineError, StateDictError, StepError, WorkerDiedError
from headrace.pipeline import Pipeline, Step, step

__version__ = "0.1.0"

__all__ = [
    "HeadraceError",
    "Pipeline",
    "PipelineError",
    "StateDictError",
    "Step",
    "StepError",
    "WorkerDiedError",
    "sources",
    "step",
]
