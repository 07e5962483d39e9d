"""What the runners learn of the steps drawing from Python's generator outlives them
(``runtime/python_draws.py``): a worker started later, a persistent worker's next epoch and the
next epoch's pool start from it, so only the first epoch runs a sample once more."""

import multiprocessing
import os
import random

import headrace as hr
from headrace.pipeline.runner import SampleRunner
from headrace.pipeline.seeding import global_states, restore_globals, sample_root, step_seed
from headrace.runtime import python_draws
from headrace.runtime.handles import HandOff, Progress
from headrace.runtime.worker import Task, TaskRunner, WorkerSetup

CTX = multiprocessing.get_context("fork")


class DrawsFromFour:
    """``dataset[i]``: ``i`` below 4, else ``random.random()``; its calls by index."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> float:
        self.calls.append(i)
        return float(i) if i < 4 else random.random()


def test_workers_start_from_what_their_pool_and_earlier_pools_learned():
    saved = global_states()  # the runners re-seed this process's global generators
    try:
        ds = DrawsFromFour()
        pipe = hr.Pipeline.from_dataset(ds)
        shared = python_draws.shared(CTX, pipe)
        assert list(shared) == [0]  # a new source: nothing known

        def worker(slot: int) -> TaskRunner:
            setup = WorkerSetup(slot, 3, 0, pipe, ds, None, os.getpid(), False)
            return TaskRunner(setup, HandOff(CTX, 1), Progress(CTX, 3), python_draws=shared)

        def run(w: TaskRunner, index: int, epoch: int) -> float:
            return w.run(Task(0, index, 0, None, 5, epoch, False), None).value

        a, b = worker(0), worker(1)
        assert run(b, 0, 0) == 0.0  # b ran a sample before anyone knew
        run(a, 4, 0)  # a's first draw: that sample runs again, seeded, and the pool is told
        assert ds.calls == [0, 4, 4] and list(shared) == [1]
        c = worker(2)  # started now (a replacement, the scaler's): told at its start
        run(c, 5, 0)
        # b, persistent, is told at its next epoch: no second run there either
        value = run(b, 6, 1)
        assert ds.calls == [0, 4, 4, 5, 6], ds.calls
        seed = step_seed(sample_root(5, 1, 6), pipe.keys[0])
        assert value == random.Random(seed).random()  # seeded, as every run that draws
        # the pool's shutdown keeps it for the next pools over this source object
        python_draws.learn(pipe, shared)
        assert list(python_draws.shared(CTX, pipe)) == [1]
        assert list(python_draws.shared(CTX, hr.Pipeline.from_dataset(ds))) == [0]  # another
    finally:
        restore_globals(saved)


class _Floats:
    def __len__(self) -> int:
        return 8

    def load(self, i: int) -> float:
        return float(i)


def _jitter(x: float) -> float:
    return x + random.random()  # Python's global generator, unseeded at first


def test_the_seeded_run_again_reports_its_draws():
    """A step's first draw from Python's generator runs its sample again, seeded
    (``SampleRunner._again``): that run did not tell ``on_drew`` of the draw, so the cache's
    record of the sample carried none, and a worker finishing it after a hand-off cached its
    form (one epoch's draw served in every later epoch: a bug hunt)."""
    saved = global_states()  # the runner re-seeds this process's global generators
    try:
        runner = SampleRunner(hr.Pipeline(_Floats(), [hr.step(_jitter, name="jitter"),
                                                      hr.step(abs, name="abs")]))
        for index in range(3):  # the first runs again seeded, the next are seeded from the start
            seen: list[int] = []
            runner.run(index, 0, None, base_seed=1, epoch=0, on_drew=seen.append)
            assert seen == [1], (index, seen)
    finally:
        restore_globals(saved)
