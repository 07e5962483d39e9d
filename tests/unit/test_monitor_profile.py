"""Which finished samples the training process folds into its profile (``Monitor._profile``).

A worker measures output sizes on its first 64 samples, then one in 8 (``runtime/worker.py``),
and step times on every sample: each sample counts for the profile's times. A dataset whose
transforms run inside its ``__getitem__`` (``Pipeline.embedded``) times them only on the samples
it measures sizes on; its other runs read 0 s for every transform, and stay out."""

import pytest

import headrace as hr
from headrace.pipeline.runner import StepTiming
from headrace.runtime.monitor import Monitor

NAMES = ["load", "scale", "shift"]


@pytest.mark.parametrize("embedded", [False, True])
def test_a_sample_whose_sizes_were_not_measured_counts_for_its_times(embedded):
    monitor = Monitor(hr.Options(profile_store=False), autoscale=False, step_names=NAMES,
                      embedded=embedded)
    assert monitor.profiler is not None
    sized = [StepTiming(k, 0.002, 0.001, 64) for k in range(3)]
    monitor.on_sample(0, 0.006, False, sized)
    if embedded:  # an unmeasured embedded run: load holds the whole call, transforms read 0
        unsized = [StepTiming(0, 0.006, 0.003), StepTiming(1, 0.0, 0.0), StepTiming(2, 0.0, 0.0)]
    else:
        unsized = [StepTiming(k, 0.004, 0.002) for k in range(3)]
    for i in range(1, 8):
        monitor.on_sample(i, 0.012, False, unsized)
    rep = monitor.profiler.report()
    assert rep.sized_samples == 1
    if embedded:
        assert rep.samples == 1 and rep.step("scale").wall_mean == pytest.approx(0.002)
    else:
        assert rep.samples == 8 and rep.step("scale").wall_mean == pytest.approx(0.030 / 8)
    assert rep.step("scale").bytes_out_mean == 64
