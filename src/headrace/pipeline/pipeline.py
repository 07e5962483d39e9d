"""Pipeline: a source and an ordered list of steps. Pure and picklable."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from headrace.errors import PipelineError
from headrace.pipeline.fingerprint import pipeline_fingerprint
from headrace.pipeline.inplace import EmbeddedSource, swappable, transform_list
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
    ``embedded`` marks a dataset whose Compose-like transform stays inside it: ``steps`` describe
    its transforms, which run where ``source.load`` (the dataset's ``__getitem__``) calls them,
    measured per step but never split out, handed off between or reordered
    (``pipeline/inplace.py``).
    ``declared``: the user's step order when ``steps`` is another one (AutoOrder's, set by
    :meth:`with_steps`), else None; the runner checks the new order's premise sample by sample
    (``pipeline/order_guard.py``). ``kept_shape``: the seed keys (``keys``) of the steps that
    kept dtype and shape on every profiled sample, which that premise is about.
    """

    source: Source
    steps: tuple[Step, ...] = ()
    opaque: bool = False
    embedded: bool = False
    declared: tuple[Step, ...] | None = dataclasses.field(default=None, compare=False)
    kept_shape: frozenset[int] = dataclasses.field(default=frozenset(), compare=False)

    def __init__(self, source: Source, steps: Sequence[Step | Any] = (), opaque: bool = False,
                 embedded: bool = False, declared: Sequence[Step] | None = None,
                 kept_shape: Collection[int] = ()):
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
        object.__setattr__(self, "embedded", embedded)
        object.__setattr__(self, "declared", tuple(declared) if declared is not None else None)
        object.__setattr__(self, "kept_shape", frozenset(kept_shape))

    def __len__(self) -> int:
        return len(self.source)

    def length(self) -> int | None:
        """The source's length, or None for a map-style dataset without one: no ``__len__``,
        or one that raises (an abstract base's ``raise NotImplementedError``). torch iterates
        such a dataset with an explicit sampler and never asks its length, so headrace does
        too; where a length is needed (torch's default sampler), that sampler's ``len()``
        raises the dataset's own error."""
        try:
            return len(self.source)
        except Exception:  # noqa: BLE001 - the dataset's own __len__: no length known
            return None

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

    @property
    def splittable(self) -> bool:
        """Its steps run one by one in the runner: a sample can be handed off between them."""
        return not self.embedded and len(self.steps) > 0

    def with_steps(self, steps: Sequence[Step], kept_shape: Collection[int] = ()) -> Pipeline:
        """A new pipeline with the same source and another step order (used by the planner);
        it remembers the declared order (``declared``) unless ``steps`` is that order, and
        ``kept_shape`` (seed keys of the steps that kept dtype and shape when profiled)."""
        mine = self.declared if self.declared is not None else self.steps
        same = len(steps) == len(mine) and all(a is b for a, b in zip(steps, mine, strict=True))
        return Pipeline(self.source, steps, opaque=self.opaque, embedded=self.embedded,
                        declared=None if same else mine, kept_shape=kept_shape)

    def fingerprint(self) -> str:
        """Identity of the steps' code and order plus the source's identity (hex, 16 chars)."""
        return pipeline_fingerprint(self)

    @classmethod
    def from_dataset(cls, dataset: Any, batched: bool = True) -> Pipeline:
        """Adapt a map-style ``torch.utils.data.Dataset``; what ``dataset[i]`` computes never
        changes.

        A dataset whose ``transform`` attribute is Compose-like (has a ``transforms`` list) runs
        as it is, the user's object itself, not a copy, and so does its Compose: during each
        ``dataset[i]`` the Compose's ``transforms`` are set to wrappers that measure them step
        by step where the dataset calls them, and set back after it (``EmbeddedSource``,
        ``pipeline/inplace.py``), so changes made to the dataset or its Compose later
        (``ds.epoch = e``, a new ``transform``, ``ds.transform.offset = k``), a
        ``worker_init_fn``'s setup and the writes of ``__getitem__`` and of the Compose are seen
        as with torch. ``steps`` name the transforms for the profiler and ``explain()``. Any
        other dataset, or one whose Compose's ``transforms`` cannot be set and set back (a
        property, ``__slots__``, a ``__setattr__``; or a ``transform`` that is another object at
        each read: tried once here), is opaque: ``dataset[i]`` is the single unit of work. ``batched``: the loader batches samples (torch then fetches
        through ``__getitems__`` where the dataset has it: ``DatasetSource``; such a dataset is
        opaque).
        """
        parts = transform_list(dataset)
        batches = batched and callable(getattr(dataset, "__getitems__", None))
        if parts is not None and not batches and swappable(dataset):
            steps = [t if isinstance(t, Step) else Step(fn=t, name=callable_name(t)) for t in parts]
            return cls(EmbeddedSource(dataset, len(steps)), steps, embedded=True)
        return cls(DatasetSource(dataset, batched), (), opaque=True)
