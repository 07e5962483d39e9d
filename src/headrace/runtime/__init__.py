"""RUN: the DataLoader facade, scheduler, worker processes, lanes, batcher, epoch bookkeeping."""

from headrace.runtime.loader import DataLoader
from headrace.runtime.options import Options

__all__ = ["DataLoader", "Options"]
