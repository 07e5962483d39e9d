"""Checking AutoOrder's premise on each sample that runs in the order it chose.

AutoOrder (``planner/commute.py``) lets two steps swap places only when one of them kept its
input's dtype and shape on every profiled sample: such a step commutes with the other *in
signature*. That was measured on the inputs the step had in the declared order, and a step may
keep the shape of those inputs only: a pad to at least 32 rows keeps a 64-row input as it is,
and moved after a 16-row crop it pads every crop to 32 rows (a bug hunt: the job's first run
delivered a whole epoch of 32-row samples where the declared order gives 16, before the
epoch-end validation went back).

So in a pipeline whose steps run in another order than declared (``Pipeline.declared``), the
runner watches every pair of steps whose relative order changed. A step of such a pair that
kept dtype and shape when profiled (``Pipeline.kept_shape``) must keep its input's shape
signature (``profiler.sizes.shape_signature``, injected: this package imports no profiler) on
each sample; of a pair where neither is known to (an order restored without its profile), at
least one must. A sample that breaks it is run again from its start in the declared order, and
that is what is delivered: the declared order's output, with its seeds (a step's seed is keyed
by its name, not its place). The loader is told (``on_broke``), and goes back to the declared
order at the next epoch boundary (``planner/order.py``). A step that ran before a hand-off, in
another worker, counts as having changed the shape (its signature is not known here): at worst
a sample runs twice.

What it cannot see: a step that keeps the shape of its input in the new order but would have
changed it in the declared one (a pad to at least 32 rows moved after an 8x upsampling, on an
8-row input: 64 rows kept, where the declared order pads to 32 and upsamples to 256). Only
running both orders would show it; the profile's premise is about the inputs of the declared
order, and no profiled sample was such.

The check costs two signatures per watched step on each sample of a reordered run (about a
microsecond for an array, a few for a dict of them), and nothing on a run in the declared order.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headrace.pipeline.pipeline import Pipeline

ShapeOf = Callable[[Any], Hashable]
"""``shape_of(value) -> signature``: equal before and after a step that kept dtype and shape."""


def swapped_pairs(declared: Sequence[int], executed: Sequence[int]) -> list[tuple[int, int]]:
    """The pairs of positions ``(p, q)``, ``p < q``, in ``executed`` whose steps run in the
    other relative order in ``declared``. Both are the steps' seed keys (``Pipeline.keys``,
    ``load`` first), one per step, the same set in each."""
    at = {k: j for j, k in enumerate(declared)}
    pos = [at[k] for k in executed]
    return [(p, q) for q in range(len(pos)) for p in range(q) if pos[p] > pos[q]]


class OrderGuard:
    """The watch on one reordered pipeline (see the module docstring).

    ``watched``: executed positions whose input and output signatures are compared;
    ``keep``: those that must keep them (they did when profiled, and moved across a step);
    ``either[q]``: the positions before ``q`` whose relative order with ``q`` changed, where
    neither is known to keep them (one of the two must);
    ``to_executed[j]``: the executed position of the declared order's step ``j``.
    ``on_broke(q)``: called (once per guard) with the executed position of the first step seen
    breaking the premise.
    """

    def __init__(self, pipeline: Pipeline, shape_of: ShapeOf,
                 on_broke: Callable[[int], None] | None = None) -> None:
        assert pipeline.declared is not None
        self.declared = pipeline.with_steps(pipeline.declared)
        executed, declared = pipeline.keys, self.declared.keys
        kept = pipeline.kept_shape
        self.keep: set[int] = set()
        self.either: dict[int, tuple[int, ...]] = {}
        self.crossed: dict[int, list[int]] = {}  # each watched step: the steps it crossed
        for p, q in swapped_pairs(declared, executed):
            keepers = [i for i in (p, q) if executed[i] in kept]
            self.keep.update(keepers)
            if not keepers:
                self.either[q] = (*self.either.get(q, ()), p)
            self.crossed.setdefault(p, []).append(q)
            self.crossed.setdefault(q, []).append(p)
        self.watched = frozenset(self.keep) | {i for q, ps in self.either.items()
                                               for i in (q, *ps)}
        at = {k: i for i, k in enumerate(executed)}
        self.to_executed = [at[k] for k in declared]
        self.names = pipeline.step_names
        self.shape_of = shape_of
        self.on_broke = on_broke
        self.broken: int | None = None  # the first breaking step seen (executed position)

    @classmethod
    def of(cls, pipeline: Pipeline, shape_of: ShapeOf | None,
           on_broke: Callable[[int], None] | None = None) -> OrderGuard | None:
        """The guard of ``pipeline``, or None: it runs its declared order, or no ``shape_of``."""
        if pipeline.declared is None or shape_of is None or pipeline.embedded:
            return None
        return cls(pipeline, shape_of, on_broke)

    def broke(self, changed: dict[int, bool], q: int, before: Hashable, out: Any) -> bool:
        """Record whether step ``q`` changed the signature (``before``: its input's) and say
        whether the premise broke: ``q`` must keep it, or ``q`` and a step of ``either[q]``
        both changed it (one not run in this call counts as changed)."""
        c = self.shape_of(out) != before
        changed[q] = c
        if not c or (q not in self.keep
                     and not any(changed.get(p, True) for p in self.either.get(q, ()))):
            return False
        if self.broken is None:
            self.broken = q
            if self.on_broke is not None:
                self.on_broke(q)
        return True

    def says(self, q: int) -> str:
        """Why the order did not hold, for ``explain()`` and the log: step ``q`` broke it."""
        partners = [self.names[p] for p in sorted(self.crossed.get(q, ()))]
        why = ("it kept them on every profiled sample, in the order measured" if q in self.keep
               else "as did a step it crossed; of two steps that swap, one must keep them")
        return (f"{self.names[q]} changed a sample's dtype or shape after it was moved across "
                f"{', '.join(partners)} ({why}); such samples were run again in the declared "
                "order")
