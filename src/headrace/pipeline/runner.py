"""Running a pipeline's steps on one sample: the one place user step code is called.

Shared by worker processes and the in-process path (``num_workers=0``) so both behave the same.
Step 0 is ``Source.load``; steps 1..n are ``pipeline.steps``. Between steps the caller decides
whether to hand the sample off (MinatoLoader Algorithm 1): the sample is then returned with the
index of the next step to run, so no step ever runs twice.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from headrace.pipeline.draw_marks import PYTHON_MARKS, draw_mark, python_mark, seeded_mark
from headrace.pipeline.seeding import (
    sample_root,
    seed_globals,
    seed_numpy_torch,
    step_rng,
    step_seed,
)
from headrace.pipeline.timed import Probe, Probing

if TYPE_CHECKING:
    from headrace.pipeline.order_guard import OrderGuard
    from headrace.pipeline.pipeline import Pipeline


class StepTiming(NamedTuple):
    """Cost of one step on one sample.

    ``wall`` and ``cpu`` in seconds (CPU: the thread's CPU time). ``bytes_out``: payload bytes of
    the step's output (−1 when not measured). ``changed``: the output's type/rank signature
    differs from the input's (the planner treats such a step as a barrier). ``queued``: seconds
    of ``wall`` the thread was runnable but waited for a core (``profiler/runqueue.py``; 0 when
    not measured, and for the steps of a dataset whose transforms run inside ``load``, which
    are timed from inside it). ``reshaped``: the output's dtype/shape signature
    (``sizes.shape_signature``) differs from the input's (AutoOrder swaps two steps only when
    one of them never reshaped a sample).
    """

    step: int
    wall: float
    cpu: float
    bytes_out: int = -1
    changed: bool = False
    queued: float = 0.0
    reshaped: bool = False


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
    bytes_in: int = 0
    """Payload bytes of the value the run started from (0 when it started at ``load``)."""
    drew_at: int | None = None
    """The first step of this sample's run so far (this run, and the parts before a
    hand-off) that drew from a global random generator, where the cache watched
    (``cache.running.run_cached``): the next part stores no unseeded form after it."""


Measure = Callable[[Any], tuple[int, Hashable, Hashable]]
"""``measure(x) -> (payload bytes, type signature, shape signature)``; injected by the runtime
(profiler.sizes)."""
Clock = Callable[[], float]
"""``queued() -> seconds`` the calling thread has waited for a core so far; injected by the
runtime (``profiler.runqueue.run_queue_s``)."""


class SampleRunner:
    """Runs a pipeline's steps for samples in this process.

    With ``measure``, each step's output size and whether it changed the sample's type are
    recorded too (the profiler's input; about a microsecond per step), and with ``queued`` also
    the time the step waited for a core (two reads of that clock per step, about 4 µs).

    ``reseed_globals``: before each step, re-seed Python's, NumPy's and torch's global
    generators from the step's seed (``seeding.seed_globals``), so user code drawing from them
    is deterministic per sample. Worker threads share those generators and turn it off: their
    steps must draw from the ``rng`` they receive. Python's generator (4 of the 7 µs) is
    seeded only before the steps that have drawn from it (``python_draws``: a flag per step,
    which a worker's runners share): around any other step its state is marked
    (``draw_marks.python_mark``), and a step that drew after all is flagged and the sample runs
    again from its start, every step seeded as before. A step's first draw from Python's
    generator in a runner not told of it thus costs its sample a second run (a run inserting
    into the cache keeps the forms its steps made before that step: they drew nothing); a run
    that starts at a later step (a hand-off's second part, a cache hit), which could not run
    again from the start, seeds every step. ``on_python_draw(step)``: called when a step is
    flagged (once per step and runner), so that the flags outlive the runner and its process
    (``runtime/python_draws.py``: the next workers and epochs are told from their start).

    ``on_global_draw(step)``: called when a step drew from those global generators (their
    states compared around it, ``draw_marks.draw_mark``: about 2 µs a step; not for the
    transforms of a dataset, which run inside ``load``). ``executor="auto"`` keeps such
    pipelines on worker processes; worker threads (no ``reseed_globals``) warn, and there a
    change may also be another thread's draw (the generators are shared).

    ``guard``: when ``pipeline`` runs AutoOrder's order rather than the declared one, the check
    of that order's premise on each sample (``pipeline/order_guard.py``): a sample that breaks
    it is run again from its start in the declared order, and that run's outcome is returned.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        measure: Measure | None = None,
        reseed_globals: bool = True,
        queued: Clock | None = None,
        on_global_draw: Callable[[int], None] | None = None,
        python_draws: list[bool] | None = None,
        on_python_draw: Callable[[int], None] | None = None,
        guard: OrderGuard | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.reseed_globals = reseed_globals
        self.on_global_draw = on_global_draw
        self.measure = measure
        self.queued = queued if measure is not None else None
        self.names = pipeline.step_names
        self.keys = pipeline.keys
        self.embedded = pipeline.embedded
        load = pipeline.source.load
        self._calls: list[Callable[[Any, Any], Any]] = [lambda _x, _rng: load(_x)]
        if not self.embedded:  # embedded steps run inside load, where the dataset calls them
            for s in pipeline.steps:
                self._calls.append(s.__call__)
        self.n = len(self._calls)
        self._untimed = [StepTiming(k, 0.0, 0.0) for k in range(1, len(self.names))]
        """An embedded run's transforms when not profiled (immutable, shared by every run)."""
        self._random = [False, *(s.random for s in pipeline.steps)]
        self._seeded = reseed_globals or any(self._random)  # else no step needs a seed
        self.python_draws = python_draws if python_draws is not None else [False] * self.n
        """Per step: it drew from Python's global generator (then seeded): seen by this
        runner, or known when it was made."""
        self.on_python_draw = on_python_draw
        self._marks = reseed_globals and PYTHON_MARKS
        self.guard = guard
        """The check of AutoOrder's premise when ``pipeline`` runs another order than the
        declared one (``pipeline/order_guard.py``); None: nothing is checked."""
        self._watched = guard.watched if guard is not None else frozenset()
        self._declared: SampleRunner | None = None  # runs a sample whose run broke it

    def run(
        self,
        index: int,
        start: int,
        value: Any,
        base_seed: int,
        epoch: int,
        hand_off: Callable[[int, float], bool] | None = None,
        on_step: Callable[[int], None] | None = None,
        after_step: Callable[[int, Any], None] | None = None,
        draw: int = 0,
        on_drew: Callable[[int], None] | None = None,
        drew_through: int | None = None,
    ) -> Outcome:
        """Run steps ``start..n-1``; stop early when ``hand_off(next_step, seconds)`` says so.

        At ``start == 0`` the input is the sample index (for ``load``), else the partial value.
        ``hand_off`` is asked between steps with the next step's position and the step time this
        run has spent so far (the quantity the timeout is learned from; the runner's own
        bookkeeping is not counted); ``None`` means run to completion. ``on_step(i)`` is called
        before step ``i`` starts; ``after_step(i, output)`` after it (the cache copies a tier's
        form there, before a later step could write into it). ``draw``: the times ``index``
        came earlier in this epoch (``runtime/draws.py``), part of its seed. ``on_drew(i)``:
        called before ``after_step(i, ...)`` when step ``i`` drew from a global generator
        (``draw_marks.draw_mark`` around each step, about 2 µs; exact where the globals are
        re-seeded before every step, or marked where they are not): its output is then not the
        same in every epoch, whatever the step declares (the cache stores no unseeded form of
        it). ``drew_through``: the last step whose draws ``on_drew`` is told of (None: every
        step); the steps after it are not watched for it (the cache stores no form after them:
        ``CacheClient.draws_matter_through``).
        """
        x = index if start == 0 else value
        timings: list[StepTiming] = []
        measure, queued = self.measure, self.queued
        bytes_in, sig, shape = 0, None, None
        if measure is not None and start > 0:
            bytes_in, sig, shape = measure(x)
        spent = 0.0
        root = sample_root(base_seed, epoch, index, draw) if self._seeded else 0
        watch = self.on_global_draw
        marks = self._marks and start == 0
        last_told = (self.n if drew_through is None else drew_through) if on_drew is not None \
            else -1
        python_draws = self.python_draws
        guard, watched = self.guard, self._watched
        # per watched step run: it changed the shape signature (a reordered run only)
        changed: dict[int, bool] | None = {} if guard is not None else None
        for i in range(start, self.n):
            rng, mark = None, None
            if self._seeded:
                seed = step_seed(root, self.keys[i])
                if self.reseed_globals:
                    if marks and not python_draws[i]:
                        seed_numpy_torch(seed)
                        mark = python_mark()
                    else:
                        seed_globals(seed)
                if self._random[i]:
                    rng = step_rng(seed)
            if on_step is not None:
                on_step(i)
            if i == 0 and self.embedded:
                out = self._load_embedded(x, root, timings)
                if mark is not None and python_mark() != mark:
                    return self._again(i, index, base_seed, epoch, hand_off, on_step,
                                       after_step, draw, on_drew, drew_through)
                if isinstance(out, Outcome):
                    out.bytes_in = bytes_in
                    return out
                x, spent = out
                if after_step is not None:
                    after_step(0, x)
                continue
            told = on_drew if i <= last_told else None
            drawn = None
            if watch is not None or told is not None:  # NumPy's and torch's seeded just now?
                drawn = seeded_mark() if self._seeded and self.reseed_globals else draw_mark()
            # the run-queue reads lie inside the wall window: a wait between them and the
            # step then counts in both, never in ``queued`` alone
            ws = time.perf_counter()
            qs = queued() if queued is not None else 0.0
            cs = time.thread_time()
            shape_in = guard.shape_of(x) if guard is not None and i in watched else None
            try:
                x = self._calls[i](x, rng)
            except Exception as e:  # noqa: BLE001 - reported with its place
                if mark is not None and python_mark() != mark:  # its error may be the draw's
                    return self._again(i, index, base_seed, epoch, hand_off, on_step,
                                       after_step, draw, on_drew, drew_through)
                return Outcome(None, None, timings, (i, e, traceback.format_exc()), bytes_in)
            ce = time.thread_time()
            q = queued() - qs if queued is not None else 0.0
            we = time.perf_counter()
            if mark is not None and python_mark() != mark:  # drew unseeded: again, seeded
                return self._again(i, index, base_seed, epoch, hand_off, on_step, after_step,
                                   draw, on_drew, drew_through)
            if shape_in is not None and guard is not None and changed is not None \
                    and guard.broke(changed, i, shape_in, x):
                return self._in_declared_order(index, base_seed, epoch, on_step, draw)
            spent += we - ws
            if drawn is not None and draw_mark() != drawn:
                for tell in (watch, told):
                    if tell is not None:
                        tell(i)
            if measure is not None:
                size, new_sig, new_shape = measure(x)
                timings.append(StepTiming(i, we - ws, ce - cs, size, i > 0 and new_sig != sig,
                                          min(max(q, 0.0), we - ws),
                                          i > 0 and new_shape != shape))
                sig, shape = new_sig, new_shape
            else:
                timings.append(StepTiming(i, we - ws, ce - cs))
            if after_step is not None:
                after_step(i, x)
            if hand_off is not None and i + 1 < self.n and hand_off(i + 1, spent):
                return Outcome(x, i + 1, timings, None, bytes_in)
        return Outcome(x, None, timings, None, bytes_in)

    def _again(self, step: int, index: Any, base_seed: int, epoch: int,
               hand_off: Callable[[int, float], bool] | None,
               on_step: Callable[[int], None] | None,
               after_step: Callable[[int, Any], None] | None, draw: int,
               on_drew: Callable[[int], None] | None, drew_through: int | None) -> Outcome:
        """The run of a sample whose ``step`` drew from Python's generator unseeded: that
        step is seeded from now on, and the sample runs again from its start. ``on_drew`` is
        told of the draws of that run: without it, a run handed off after the draw carried no
        draw, and the worker finishing it cached its form, one epoch's draw served in every
        later epoch (a bug hunt: 3 of 3 runs froze a sample). ``after_step`` is called again
        from ``step`` on only: the outputs before it were given in the first run, and are what
        this one computes (those steps drew from no generator left unseeded)."""
        self.python_draws[step] = True
        if self.on_python_draw is not None:
            self.on_python_draw(step)
        after = None if after_step is None else _from_step(after_step, step)
        return self.run(index, 0, None, base_seed, epoch, hand_off, on_step, after, draw,
                        on_drew, drew_through)

    def _in_declared_order(self, index: Any, base_seed: int, epoch: int,
                           on_step: Callable[[int], None] | None, draw: int) -> Outcome:
        """The run of a sample that broke the premise of the order running
        (``pipeline/order_guard.py``): from its start, in the declared order, to the end
        (no hand-off, no cache), with step positions given as the executed order's. It starts
        from the steps this runner knows to draw from Python's generator, and what it learns
        is this runner's too (each costs a sample a second run)."""
        guard = self.guard
        assert guard is not None
        to = guard.to_executed
        if self._declared is None:
            watch, mine = self.on_global_draw, self.python_draws

            def drew(j: int) -> None:
                mine[to[j]] = True
                if self.on_python_draw is not None:
                    self.on_python_draw(to[j])

            self._declared = SampleRunner(
                guard.declared, None, self.reseed_globals,
                on_global_draw=(lambda j: watch(to[j])) if watch is not None else None,
                python_draws=[mine[to[j]] for j in range(self.n)], on_python_draw=drew)
        out = self._declared.run(index, 0, None, base_seed, epoch,
                                 on_step=(lambda j: on_step(to[j])) if on_step is not None else None,
                                 draw=draw)
        error = None if out.error is None else (
            to[out.error[0]], out.error[1],
            f"{out.error[2]}(headrace: this sample ran again in the declared step order, as "
            "AutoOrder's order did not hold on it: pipeline/order_guard.py)\n")
        return Outcome(out.value, None, [t._replace(step=to[t.step]) for t in out.timings],
                       error)

    def _load_embedded(
        self, index: int, root: int, timings: list[StepTiming]
    ) -> tuple[Any, float] | Outcome:
        """``load`` of a dataset whose transforms run inside it (``pipeline/inplace.py``):
        append a timing for ``load`` itself (its time less its transforms') and one per
        transform (on a run that is not profiled, the whole call is load's and the transforms
        read zero); an error inside a transform is reported at that transform's step."""
        n = len(self.names) - 1
        keys = self.keys

        def rngs(position: int, call: int) -> Any:
            return step_rng(step_seed(root, keys[position + 1] + 0x9E3779B1 * call))

        probe = Probe(n, self.measure, rngs, timed=self.measure is not None)
        ws, cs = time.perf_counter(), time.thread_time()
        try:
            with Probing(probe):
                x = self._calls[0](index, None)
        except Exception as e:  # noqa: BLE001 - reported with its place
            step = 0 if probe.failed is None else probe.failed + 1
            return Outcome(None, None, timings, (step, e, traceback.format_exc()))
        wall, cpu = time.perf_counter() - ws, time.thread_time() - cs
        if self.measure is None:  # the transforms were not timed
            timings.append(StepTiming(0, wall, cpu))
            timings.extend(self._untimed)
            return x, wall
        load_bytes = probe.bytes_in
        if load_bytes < 0:  # the dataset never called its transform
            load_bytes = self.measure(x)[0]
        timings.append(StepTiming(0, max(0.0, wall - sum(probe.wall)),
                                  max(0.0, cpu - sum(probe.cpu)), load_bytes))
        for k in range(n):
            timings.append(StepTiming(k + 1, probe.wall[k], probe.cpu[k], probe.bytes_out[k],
                                      probe.changed[k], reshaped=probe.reshaped[k]))
        return x, wall


def _from_step(after_step: Callable[[int, Any], None], first: int) -> Callable[[int, Any], None]:
    """``after_step`` called for the steps from ``first`` on only."""

    def after(i: int, x: Any) -> None:
        if i >= first:
            after_step(i, x)

    return after
