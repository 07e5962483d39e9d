"""Stage 2 of the near-storage profiler: per-sample sizes and CPU per step, bounded."""

from __future__ import annotations

import numpy as np

from headrace.pipeline.runner import SampleRunner, StepTiming
from headrace.profiler import sizes
from headrace.profiler.sample_sizes import SampleSizes


def test_records_whole_and_split_samples() -> None:
    rec = SampleSizes(4, 3)
    rec.listener(2, 0.1, False, [StepTiming(0, 0.0, 0.001, 1000), StepTiming(1, 0.0, 0.02, 8000),
                                 StepTiming(2, 0.0, 0.003, 600)])
    # a sample split at step 1: the storage side's part, then the training side's
    rec.listener(1, None, True, [StepTiming(0, 0.0, 0.001, 500), StepTiming(1, 0.0, 0.01, 4000)])
    rec.listener(1, 0.2, True, [StepTiming(2, 0.0, 0.002, 300)])
    rec.listener(3, 0.1, False, [StepTiming(0, 0.0, 0.001, -1)])  # size not measured: ignored
    rec.listener(99, 0.1, False, [StepTiming(0, 0.0, 0.001, 5)])  # outside the set: ignored
    assert rec.measured() == 2
    prof = rec.profile()
    np.testing.assert_allclose(prof.sizes[2], [1000, 8000, 600])
    np.testing.assert_allclose(prof.sizes[1], [500, 4000, 300])
    np.testing.assert_allclose(prof.cpu[1], [0.001, 0.01, 0.002], rtol=1e-6)
    assert np.isnan(prof.sizes[0]).all() and np.isnan(prof.sizes[3]).all()


def test_memory_is_eight_bytes_per_sample_and_step() -> None:
    rec = SampleSizes(100_000, 5)
    assert rec.nbytes == 100_000 * 5 * 8


def test_fed_by_the_runner_measurements() -> None:
    import headrace as hr

    class Src:
        def __len__(self) -> int:
            return 3

        def load(self, i: int) -> np.ndarray:
            return np.zeros(100 * (i + 1), np.uint8)

    pipe = hr.Pipeline(Src(), [hr.step(lambda x: x.astype(np.float32), name="widen"),
                               hr.step(lambda x: x[:10], name="crop")])
    runner = SampleRunner(pipe, sizes.measure)
    rec = SampleSizes(3, 3)
    for i in range(3):
        out = runner.run(i, 0, None, base_seed=0, epoch=0)
        rec.observe(i, out.timings)
    np.testing.assert_allclose(rec.profile().sizes, [[100, 400, 40], [200, 800, 40],
                                                     [300, 1200, 40]])


def test_the_runner_flags_the_steps_that_change_dtype_or_shape() -> None:
    import headrace as hr

    class Src:
        def __len__(self) -> int:
            return 2

        def load(self, i: int) -> np.ndarray:
            return np.zeros((4, 4), np.uint8)

    pipe = hr.Pipeline(Src(), [hr.step(lambda x: x[::-1].copy(), name="flip"),
                               hr.step(lambda x: x.astype(np.float32), name="cast"),
                               hr.step(lambda x: x[:2], name="crop"),
                               hr.step(lambda x: x + 1, name="shift")])
    out = SampleRunner(pipe, sizes.measure).run(0, 0, None, base_seed=0, epoch=0)
    assert [t.reshaped for t in out.timings] == [False, False, True, True, False]
    # a run resumed at a later step compares with the value it was handed
    later = SampleRunner(pipe, sizes.measure).run(0, 3, np.zeros((4, 4), np.float32),
                                                   base_seed=0, epoch=0)
    assert [t.reshaped for t in later.timings] == [True, False]
