"""The near-storage controller (remote/storage.py) without Ray: profile, account, re-decide."""

from __future__ import annotations

import numpy as np
import pytest

import headrace as hr
from headrace.pipeline.runner import StepTiming
from headrace.remote.storage import StorageSide

NAMES = ["load", "decode", "crop", "to_float"]


def timings(raw: float, cpu: float = 0.01) -> list[StepTiming]:
    return [StepTiming(0, 0.0, 1e-4, int(raw)), StepTiming(1, 0.0, cpu, int(raw * 8)),
            StepTiming(2, 0.0, 1e-3, 150_000), StepTiming(3, 0.0, 1e-3, 600_000)]


def test_first_epoch_raw_then_decided_from_its_profile() -> None:
    side = StorageSide(hr.NearStorage(bandwidth=1e6), 10, NAMES, compute_cores=4)
    assert all(side[i] == 1 for i in range(10))
    for i in range(10):
        side.on_sample(i, 0.1, False, timings(400_000 if i % 2 else 50_000))
    side.on_epoch_closed(wall_s=2.0)
    first = side.epochs[0]
    assert first.plan is None and first.samples == 10
    assert first.bytes == pytest.approx(5 * 400_000 + 5 * 50_000)
    # the next epoch: large ones cropped on the storage side, small ones raw
    assert [side[i] for i in range(10)] == [1, 3] * 5
    assert "stage 1: I/O-bound" in side.note
    # a fetcher's hand-back at the stop is counted; the bytes moved follow the stops
    for i in range(10):
        t = timings(400_000 if i % 2 else 50_000)
        stop = side[i]
        side.on_sample(i, None, True, t[:stop])
        side.on_sample(i, 0.1, True, t[stop:])
    side.on_epoch_closed(wall_s=1.0)
    second = side.epochs[1]
    assert second.handed_back == 10
    assert second.bytes == pytest.approx(5 * 150_000 + 5 * 50_000)
    assert second.plan is not None and second.plan.offloaded == 5
    text = "\n".join(side.lines())
    assert "epoch 1: predicted" in text and "measured" in text


def test_fast_link_is_not_io_bound() -> None:
    side = StorageSide(hr.NearStorage(bandwidth=1e12), 4, NAMES, compute_cores=1)
    for i in range(4):
        side.on_sample(i, 0.1, False, timings(400_000, cpu=0.5))
    side.on_epoch_closed(wall_s=2.0)
    assert [side[i] for i in range(4)] == [1] * 4
    assert "not I/O-bound" in side.note


def test_fixed_policies_need_no_profile() -> None:
    side = StorageSide(hr.NearStorage(policy="resize-off", resize_step="crop"), 3, NAMES, 2)
    assert [side[i] for i in range(3)] == [3, 3, 3]
    side = StorageSide(hr.NearStorage(policy="all-off"), 3, NAMES, 2)
    assert side[0] == 4
    for i in range(3):
        side.on_sample(i, 0.1, False, timings(1000))
    side.on_epoch_closed(1.0)
    assert side[0] == 4  # fixed: not re-decided
    with pytest.raises(ValueError, match="not a step"):
        StorageSide(hr.NearStorage(policy="resize-off", resize_step="blur"), 3, NAMES, 2)
    assert np.isnan(StorageSide(hr.NearStorage(), 2, NAMES, 1).recorder.sizes).all()
