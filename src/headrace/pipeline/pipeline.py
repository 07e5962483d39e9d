"""Pipeline: a source and an ordered list of steps. Pure and picklable."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from headrace.errors import PipelineError
from headrace.pipeline.fingerprint import pipeline_fingerprint
from headrace.pipeline.seeding import step_keys
from headrace.pipeline.source import DatasetSource, Source
from headrace.pipeline.step import Step, callable_name, step

LOAD_STEP = "load"
"""Name of the pseudo-step that runs ``Source.load`` (step 0 of every execution)."""


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """What to compute for each sample: ``steps`` applied in order to ``source.load(index)``.

    ``opaque`` marks a pipeline built from a plain Dataset: one step per sample (``__getitem__``),
    which headrace still schedules per sample but cannot reorder or split.
    """

    source: Source
    steps: tuple[Step, ...] = ()
    opaque: bool = False

    def __init__(self, source: Source, steps: Sequence[Step | Any] = (), opaque: bool = False):
        if not hasattr(source, "load") or not hasattr(source, "__len__"):
            raise PipelineError(
                f"source {type(source).__name__} must have __len__ and load(index); "
                "wrap a map-style Dataset with headrace.Pipeline.from_dataset(ds)"
            )
        norm = tuple(s if isinstance(s, Step) else step(s) for s in steps)
        names = [s.name for s in norm]
        if LOAD_STEP in names:
            raise PipelineError(f"step name {LOAD_STEP!r} is reserved for Source.load")
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "steps", norm)
        object.__setattr__(self, "opaque", opaque)

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> Any:
        """Run every step on one sample in this process (base seed 0, epoch 0).

        Lets any map-style consumer, torch's DataLoader included, iterate a pipeline.
        """
        from headrace.pipeline.runner import SampleRunner

        out = SampleRunner(self).run(index, 0, None, base_seed=0, epoch=0)
        if out.error is not None:
            raise out.error[1]
        return out.value

    @property
    def step_names(self) -> list[str]:
        """Names of the executed steps, ``"load"`` first."""
        return [LOAD_STEP, *(s.name for s in self.steps)]

    @property
    def keys(self) -> list[int]:
        """Seed keys of the executed steps (``load`` included), stable under reordering."""
        return step_keys(self.step_names)

    def with_steps(self, steps: Sequence[Step]) -> Pipeline:
        """A new pipeline with the same source and another step order (used by the planner)."""
        return Pipeline(self.source, steps, opaque=self.opaque)

    def fingerprint(self) -> str:
        """Identity of the steps' code and order plus the source's identity (hex, 16 chars)."""
        return pipeline_fingerprint(self)

    @classmethod
    def from_dataset(cls, dataset: Any) -> Pipeline:
        """Adapt a map-style ``torch.utils.data.Dataset``.

        A dataset whose ``transform`` attribute is Compose-like (has a ``transforms`` list) is
        split: ``dataset[i]`` without its transform is the source, each transform is a step. As
        in torchvision, when the dataset returns a tuple the transforms apply to its first
        element. Any other dataset is opaque: ``dataset[i]`` is the single unit of work.
        """
        tf = getattr(dataset, "transform", None)
        parts = getattr(tf, "transforms", None)
        if tf is not None and isinstance(parts, (list, tuple)) and parts:
            steps = [_input_step(t) for t in parts]
            return cls(DatasetSource(dataset, strip_transform=True), steps)
        return cls(DatasetSource(dataset), (), opaque=True)


class _OnInput:
    """Apply a transform to element 0 of a tuple sample (torchvision convention), else to all."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, x: Any) -> Any:
        if isinstance(x, tuple) and x:
            return (self.fn(x[0]), *x[1:])
        return self.fn(x)

    def __repr__(self) -> str:
        return f"_OnInput({self.fn!r})"


def _input_step(t: Any) -> Step:
    if isinstance(t, Step):
        return t
    return Step(fn=_OnInput(t), name=callable_name(t))
