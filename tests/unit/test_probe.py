"""FastFlow's Gthp/Lthp probe: structure, verdict, threshold, and the loader's iterator closed.

Simulated time: a fake clock that the fake loader and train_step advance, so the numbers are
exact and no test depends on the machine's speed. One test runs a real (in-process) headrace
DataLoader whose samples sleep, against a train_step that does nothing: unambiguously
input-bound, and it asserts only the verdict and the structure.
"""

from __future__ import annotations

import time

import pytest

import headrace as hr
from headrace.profiler.probe import DEFAULT_THRESHOLD, ProbeResult, probe


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class FakeLoader:
    """``n`` batches; producing one advances the clock by ``cost_s``; records ``close()``."""

    def __init__(self, clock: Clock, n: int, cost_s: float) -> None:
        self.clock, self.n, self.cost_s = clock, n, cost_s
        self.closed = 0

    def __iter__(self) -> FakeLoader.It:
        return FakeLoader.It(self)

    class It:
        def __init__(self, owner: FakeLoader) -> None:
            self.owner, self.i = owner, 0

        def __next__(self) -> list[int]:
            if self.i >= self.owner.n:
                raise StopIteration
            self.owner.clock.t += self.owner.cost_s
            self.i += 1
            return [self.i]

        def close(self) -> None:
            self.owner.closed += 1


def step_costing(clock: Clock, seconds: float, seen: list[object] | None = None):
    def train_step(batch: object) -> None:
        clock.t += seconds
        if seen is not None:
            seen.append(batch)

    return train_step


def test_slow_loader_fast_step_is_input_bound_with_exact_numbers():
    clock = Clock()
    loader = FakeLoader(clock, n=100, cost_s=0.050)
    seen: list[object] = []
    r = probe(loader, step_costing(clock, 0.001, seen), batches=10, warmup=2, clock=clock)
    assert isinstance(r, ProbeResult)
    assert r.verdict == "input-bound" and r.input_bound
    assert (r.batches, r.replays, r.warmup, r.threshold) == (10, 10, 2, DEFAULT_THRESHOLD)
    assert r.lthp == pytest.approx(1 / 0.051)
    assert r.gthp == pytest.approx(1 / 0.001)
    assert r.speedup == pytest.approx(51.0)
    assert r.stall_fraction == pytest.approx(50 / 51)
    assert loader.closed == 1
    # 2 warm-up + 10 timed batches, then 2 + 10 replays of the first batch
    assert seen[:12] == [[i] for i in range(1, 13)]
    assert seen[12:] == [[1]] * 12
    text = r.describe()
    for needle in ("input-bound", "Lthp", "Gthp", "19.61", "1000.00", "0.02 < 0.90"):
        assert needle in text, text


def test_free_loader_is_accelerator_bound():
    clock = Clock()
    r = probe(FakeLoader(clock, 50, 0.0), step_costing(clock, 0.010), batches=5, warmup=1,
              clock=clock)
    assert r.verdict == "accelerator-bound" and not r.input_bound
    assert r.lthp == pytest.approx(r.gthp) and r.stall_fraction == pytest.approx(0.0, abs=1e-9)
    assert "keeps up within 10%" in r.describe()


def test_threshold_decides_a_small_stall():
    # loader 1 ms + step 10 ms: Lthp/Gthp = 10/11 = 0.909
    def run(threshold: float) -> ProbeResult:
        clock = Clock()
        return probe(FakeLoader(clock, 50, 0.001), step_costing(clock, 0.010), batches=5,
                     warmup=0, threshold=threshold, clock=clock)

    assert run(0.10).verdict == "accelerator-bound"  # a 10% gain is FastFlow's bar
    assert run(0.05).verdict == "input-bound"


def test_whole_epoch_and_short_loaders():
    clock = Clock()
    r = probe(FakeLoader(clock, 7, 0.01), step_costing(clock, 0.0), batches=None, warmup=2,
              replays=3, clock=clock)
    assert (r.batches, r.replays) == (5, 3)
    r = probe(FakeLoader(clock, 4, 0.01), step_costing(clock, 0.0), batches=20, warmup=1,
              clock=clock)
    assert r.batches == 3  # the epoch ended first: the batches seen are used
    with pytest.raises(ValueError, match="warm-up"):
        probe(FakeLoader(clock, 2, 0.01), step_costing(clock, 0.0), warmup=3, clock=clock)
    with pytest.raises(ValueError, match="no batch left"):
        probe(FakeLoader(clock, 2, 0.01), step_costing(clock, 0.0), warmup=2, clock=clock)


@pytest.mark.parametrize("kwargs", [{"batches": 0}, {"warmup": -1}, {"threshold": 1.0},
                                    {"threshold": -0.1}, {"replays": 0}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        probe([[1]] * 10, lambda b: None, **kwargs)


def test_sync_is_called_around_each_window():
    calls: list[int] = []
    probe([[1]] * 4, lambda b: None, batches=2, warmup=1, sync=lambda: calls.append(1))
    assert len(calls) == 4  # start and end of Lthp's window, then of Gthp's


class SleepySource:
    """Each sample sleeps 50 ms when loaded: a loader far slower than a no-op train_step."""

    def __len__(self) -> int:
        return 8

    def load(self, i: int) -> int:
        time.sleep(0.05)
        return i


def test_real_loader_with_slow_samples_and_a_no_op_step_is_input_bound():
    loader = hr.DataLoader(hr.Pipeline(SleepySource()), batch_size=1,
                           options=hr.Options(profile_store=False))
    r = probe(loader, lambda batch: None, batches=2, warmup=1)
    assert r.verdict == "input-bound"
    assert r.batches == 2 and r.replays == 2 and r.lthp > 0 and r.gthp > r.lthp
    assert r.describe().startswith("input-bound: ")
