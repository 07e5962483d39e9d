"""Running a pipeline's steps on one sample: the one place user step code is called.

Shared by worker processes and the in-process path (``num_workers=0``) so both behave the same.
Step 0 is ``Source.load``; steps 1..n are ``pipeline.steps``. Between steps the elapsed time is
compared with the hand-off timeout (MinatoLoader Algorithm 1): a sample over it stops and is
returned with the index of the next step to run, so no step ever runs twice.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headrace.pipeline.seeding import sample_seed, seed_globals, step_rng

if TYPE_CHECKING:
    from headrace.pipeline.pipeline import Pipeline


@dataclass(frozen=True)
class StepTiming:
    """Cost of one step on one sample: ``wall`` and ``cpu`` in seconds (thread CPU time)."""

    step: int
    wall: float
    cpu: float


@dataclass
class Outcome:
    """What running steps on a sample produced.

    ``next_step`` is ``None`` when the sample is finished, else the step to resume at.
    ``error`` holds (step position, exception, formatted traceback) when a step raised.
    """

    value: Any
    next_step: int | None
    timings: list[StepTiming]
    error: tuple[int, BaseException, str] | None = None


class SampleRunner:
    """Runs a pipeline's steps for samples in this process."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.names = pipeline.step_names
        self.keys = pipeline.keys
        self.n = len(self.names)
        load = pipeline.source.load
        self._calls: list[Callable[[Any, Any], Any]] = [lambda _x, _rng: load(_x)]
        for s in pipeline.steps:
            self._calls.append(s.__call__)
        self._random = [False, *(s.random for s in pipeline.steps)]

    def run(
        self,
        index: int,
        start: int,
        value: Any,
        base_seed: int,
        epoch: int,
        timeout: Callable[[], float] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> Outcome:
        """Run steps ``start..n-1``; stop early when ``timeout()`` seconds have elapsed.

        At ``start == 0`` the input is the sample index (for ``load``), else the partial value.
        ``timeout`` is read between steps (it may change while the sample runs); ``None`` or
        ``inf`` means run to completion. ``on_step(i)`` is called before step ``i`` starts.
        """
        x = index if start == 0 else value
        timings: list[StepTiming] = []
        t0 = time.perf_counter()
        for i in range(start, self.n):
            seed = sample_seed(base_seed, epoch, index, self.keys[i])
            seed_globals(seed)
            rng = step_rng(seed) if self._random[i] else None
            if on_step is not None:
                on_step(i)
            ws, cs = time.perf_counter(), time.thread_time()
            try:
                x = self._calls[i](x, rng)
            except Exception as e:  # noqa: BLE001 - reported with its place
                return Outcome(None, None, timings, (i, e, traceback.format_exc()))
            we = time.perf_counter()
            timings.append(StepTiming(i, we - ws, time.thread_time() - cs))
            if timeout is not None and i + 1 < self.n:
                limit = timeout()
                if limit < math.inf and we - t0 > limit:
                    return Outcome(x, i + 1, timings)
        return Outcome(x, None, timings)
