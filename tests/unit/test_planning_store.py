"""``runtime.planning.Planning`` with a real profile store and no process: when the stored
profile is read and when this run's profile replaces it."""

from __future__ import annotations

import math

import headrace as hr
from headrace.pipeline.runner import StepTiming
from headrace.profiler.stats import Profiler
from headrace.runtime.monitor import Monitor
from headrace.runtime.planning import Planning
from tests.helpers import VecSource, crop_quarter, noise

N = 64
STORED = 300  # samples of the profile the earlier run stored


def planning(store) -> Planning:
    pipe = hr.Pipeline(VecSource(N), [hr.step(noise, random=True),
                                      hr.step(crop_quarter, random=True)])
    options = hr.Options(profile_store=store)
    monitor = Monitor(options, autoscale=False, step_names=pipe.step_names)
    monitor.use_executor("processes")
    return Planning(pipe, options, monitor)


def observe(profiler: Profiler, samples: int, step_s: float = 1e-4) -> None:
    n = len(profiler.step_names)
    for _ in range(samples):
        profiler.observe([StepTiming(k, step_s, step_s) for k in range(n)], None,
                         total=n * step_s)


def stored_run(store) -> Planning:
    """An earlier run of the job: STORED samples profiled and saved."""
    earlier = planning(store)
    assert earlier.monitor.profiler is not None
    observe(earlier.monitor.profiler, STORED)
    earlier.after_epoch(now=True)
    assert earlier.store is not None and earlier.store.get(earlier.key).samples == STORED
    return earlier


def test_a_resume_that_pins_the_order_still_reads_the_stored_profile(tmp_path):
    """A state dict pins the order (``restore``): ``before_epoch`` skipped ``decide()``, the
    only reader of the store, so the resumed run redid the warm-up (a bug hunt's find)."""
    store = tmp_path / "store.sqlite"
    stored_run(store)
    resumed = planning(store)
    resumed.restore(("noise", "crop_quarter"), "kept")
    resumed.before_epoch()
    assert resumed.stored is not None and resumed.stored.samples == STORED
    assert math.isfinite(resumed.monitor.timeout.timeout_s)  # seeded: no warm-up
    assert resumed.monitor.known_step_p50.keys() == {"load", "noise", "crop_quarter"}
    assert resumed.note.startswith(f"reused a stored profile of {STORED} samples")


def test_a_smaller_profile_leaves_the_stored_one_and_is_never_read_back_as_reused(tmp_path):
    """The resumed epoch's 180 samples replaced the stored 300, and explain() then called its
    own profile read back "reused a stored profile of 180 samples (warm-up skipped)"."""
    store = tmp_path / "store.sqlite"
    stored_run(store)
    resumed = planning(store)
    resumed.restore(("noise", "crop_quarter"), "kept")
    resumed.before_epoch()
    assert resumed.monitor.profiler is not None
    observe(resumed.monitor.profiler, 180)
    resumed.after_epoch(now=True)
    assert resumed.store is not None and resumed.store.get(resumed.key).samples == STORED
    observe(resumed.monitor.profiler, 180)  # 360 now: more than the stored one
    resumed.after_epoch(now=True)
    assert resumed.store.get(resumed.key).samples == 360


def test_no_lookup_after_this_runs_own_save(tmp_path):
    """A read of the store after this run's first save finds this run's own profile: the save
    ends the lookups, so explain() (which plans the next order) claims no reuse."""
    store = tmp_path / "store.sqlite"
    first = planning(store)
    assert first.monitor.profiler is not None
    observe(first.monitor.profiler, N)
    first.after_epoch(now=True)
    first.decide()  # explain() and state_dict() plan the next order: they read no store now
    assert first.stored is None and first.note == "measured this run"
