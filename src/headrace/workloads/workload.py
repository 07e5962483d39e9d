"""Workload: a pipeline plus the training configuration a paper runs it with."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.pipeline import Pipeline
from headrace.planner.workers import available_cpus

CPU_BOUND_MAX_WORKERS = 4
"""Worker budget of the CPU-bound workloads (imseg, objdet, imagenet) on a machine with at
least this many usable cores."""


def cpu_bound_workers() -> int:
    """Worker budget for a workload whose steps are all CPU work: the usable cores, at most
    :data:`CPU_BOUND_MAX_WORKERS`. More workers than cores only time-slice the same cores (torch
    itself warns above the core count) and make per-sample wall times depend on how many
    workers happen to be running, which the yardsticks take as given."""
    return min(CPU_BOUND_MAX_WORKERS, available_cpus())


@dataclass(frozen=True)
class Workload:
    """A synthetic workload, ready to hand to a loader.

    Attributes:
        name: registry name (``"speech-3s"``, ``"imseg"``, ...).
        pipeline: the source and steps; also a map-style dataset (``pipeline[i]`` runs every
            step with base seed 0), so ``torch.utils.data.DataLoader(pipeline)`` works too.
            Every sample is a dict with an ``"index"`` entry (the dataset index), so a harness
            can check that each index was delivered exactly once, whichever loader it ran.
        batch_size: samples per batch, as in the paper's training configuration.
        num_workers: worker processes both loaders get (the same budget for a fair comparison).
        accelerator_step_s: simulated accelerator time per batch, in seconds: the consumer
            sleeps this long per batch instead of training a model.
        description: one paragraph: what the samples and steps are and where the numbers
            come from.
    """

    name: str
    pipeline: Pipeline
    batch_size: int
    num_workers: int
    accelerator_step_s: float
    description: str

    def __len__(self) -> int:
        """Number of samples in one epoch."""
        return len(self.pipeline)

    @property
    def num_batches(self) -> int:
        """Batches per epoch without ``drop_last``."""
        return -(-len(self.pipeline) // self.batch_size)


def scaled_count(base: int, scale: float, minimum: int = 1) -> int:
    """``round(base * scale)``, at least ``minimum``: the sample count at a given scale."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    return max(minimum, round(base * scale))
