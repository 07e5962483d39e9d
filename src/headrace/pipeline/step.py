"""A step: one callable of the preprocessing pipeline and the traits the planner needs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from headrace.errors import PipelineError

StepKind = Literal["decode", "transform", "augment"]
_KINDS = ("decode", "transform", "augment")


@dataclasses.dataclass(frozen=True)
class Step:
    """One preprocessing step.

    Attributes:
        fn: the callable. Called ``fn(x)``, or ``fn(x, rng)`` when ``random`` is true, where
            ``rng`` is a ``numpy.random.Generator`` seeded from (base seed, epoch, sample index,
            step name): the same sample gets the same draws whichever worker runs it.
        name: stable name, used in errors, profiles, plans and per-step seeds.
        random: the step draws random numbers from ``rng``.
        keep_position: a barrier; the planner never moves this step or moves others across it.
        kind: ``"decode"`` changes the sample's type (a barrier too), ``"augment"`` is a random
            augmentation (whatever it draws from: nothing after it is cached as deterministic,
            ``varies``), ``"transform"`` anything else.
        commutes: the user declares the step may be reordered with its neighbours although it
            is not random (relaxed commutativity, Pecan §5.2).
    """

    fn: Callable[..., Any]
    name: str
    random: bool = False
    keep_position: bool = False
    kind: StepKind = "transform"
    commutes: bool = False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise PipelineError(f"step {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        if self.kind not in _KINDS:
            raise PipelineError(f"step {self.name!r}: kind must be one of {_KINDS}, got {self.kind!r}")
        if not self.name:
            raise PipelineError("a step needs a non-empty name")

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> Any:
        if self.random:
            if rng is None:
                raise PipelineError(f"step {self.name!r} is random and needs an rng")
            return self.fn(x, rng)
        return self.fn(x)

    @property
    def barrier(self) -> bool:
        """True when the planner must not move this step nor move others across it."""
        return self.keep_position or self.kind == "decode"

    @property
    def varies(self) -> bool:
        """True when the step's output may differ from one epoch to the next: it draws from
        ``rng`` (``random``) or is declared a random augmentation (``kind="augment"``), which
        may draw from a generator of its own that the runner cannot see or seed."""
        return self.random or self.kind == "augment"

    @property
    def movable(self) -> bool:
        """True when AutoOrder may move this step within its section (random or commutes)."""
        return not self.barrier and (self.random or self.commutes)


def step(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    random: bool = False,
    keep_position: bool = False,
    kind: StepKind = "transform",
    commutes: bool = False,
) -> Any:
    """Declare a step; usable as ``step(fn, ...)`` or as a decorator ``@step(random=True)``."""

    def make(f: Callable[..., Any]) -> Step:
        return Step(
            fn=f,
            name=name or callable_name(f),
            random=random,
            keep_position=keep_position,
            kind=kind,
            commutes=commutes,
        )

    return make(fn) if fn is not None else make


def callable_name(f: Any) -> str:
    """A readable name for any callable: function name, or class name of a callable object."""
    n = getattr(f, "__name__", None) or type(f).__name__
    return str(n)
