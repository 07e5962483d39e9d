"""The worker scaler's first window starts once every worker runs: a window with a worker
still starting (its fork and imports, the cores idle while it initialises) read CPU-bound
imagenet's cores as unsaturated and added a third worker on 2 cores (``Monitor.on_tick``); so
does one asked for and waiting for the training thread to fork it."""

import queue
import time
from types import SimpleNamespace

import pytest

import headrace as hr
from headrace.planner.workers import AutoscaleConfig
from headrace.runtime.monitor import STARTING_PAUSE_S, Monitor
from headrace.runtime.work import Counters

HOUR = 3600.0


def fake_scheduler(workers):
    timeout = SimpleNamespace(timeout=SimpleNamespace(value=0.0))
    pool = SimpleNamespace(workers=workers, handoff=timeout, executor="processes", requests=[])
    spec = SimpleNamespace(handoff=False, batches_in_flight=lambda: 2,
                           batcher=SimpleNamespace(batch_size=4, ready_samples=0))
    return SimpleNamespace(pool=pool, spec=spec, out=queue.Queue(), in_flight=0, slow_backlog=0,
                           counters=Counters())


def monitor_with_a_starting_worker():
    """(monitor, decisions it took, scheduler, worker 1 still starting): worker 0 runs, and a
    decision is long due (an hour between decisions: the test's own ticks never make one due
    by themselves)."""
    opts = hr.Options(profile=False, autoscale=AutoscaleConfig(interval_s=HOUR))
    monitor = Monitor(opts, autoscale=True, step_names=None)
    decided = []
    monitor._autoscale = decided.append
    starting = SimpleNamespace(ready=False, retiring=False, external=False,
                               started=time.monotonic())
    running = SimpleNamespace(ready=True, retiring=False, external=False)
    sched = fake_scheduler({0: running, 1: starting})
    monitor._last_scale -= 10 * HOUR
    monitor.scaler.observe_queue(0.0)
    return monitor, decided, sched, starting


def test_no_decision_while_a_worker_starts_and_a_fresh_window_after():
    monitor, decided, sched, starting = monitor_with_a_starting_worker()
    monitor.on_tick(sched)
    assert decided == []  # ...but worker 1 still starts: none
    starting.ready = True
    monitor.on_tick(sched)
    assert decided == []  # every worker runs now: a new window begins here
    assert monitor.scaler.queue_avg is None  # with a new queue average
    monitor._last_scale -= HOUR
    monitor.on_tick(sched)
    assert decided == [sched]
    # retiring and external (remote) workers do not hold the scaler back
    sched.pool.workers[2] = SimpleNamespace(ready=False, retiring=True, external=False)
    sched.pool.workers[3] = SimpleNamespace(ready=False, retiring=False, external=True)
    monitor._last_scale -= HOUR
    monitor.on_tick(sched)
    assert decided == [sched, sched]
    # a worker asked for and not yet forked by the training thread (runtime/forks.py) starts too
    sched.pool.requests.append((None, None))
    monitor._last_scale -= HOUR
    monitor.on_tick(sched)
    assert decided == [sched, sched]
    sched.pool.requests.clear()
    monitor.on_tick(sched)
    assert decided == [sched, sched]  # a new window from here
    monitor._last_scale -= HOUR
    monitor.on_tick(sched)
    assert decided == [sched, sched, sched]


def test_no_decision_before_the_pool_forked_a_worker():
    """The scheduler ticks before the training thread forks the epoch's pool: a decision due
    then (the loader built longer than ``interval_s`` ago) was taken on no workers, and asked
    for more on top of the pool's own start (``initial=1`` started 2)."""
    opts = hr.Options(profile=False, autoscale=AutoscaleConfig(interval_s=HOUR))
    monitor = Monitor(opts, autoscale=True, step_names=None)
    decided = []
    monitor._autoscale = decided.append
    sched = fake_scheduler({})
    monitor._last_scale -= 10 * HOUR
    monitor.on_tick(sched)
    assert decided == []  # no worker yet: as one still starting
    sched.pool.workers[0] = SimpleNamespace(ready=True, retiring=False, external=False)
    monitor.on_tick(sched)
    assert decided == []  # the pool runs: a fresh window begins here
    monitor._last_scale -= HOUR
    monitor.on_tick(sched)
    assert decided == [sched]


def test_a_worker_starting_for_ever_does_not_freeze_the_scaler():
    """A ``worker_init_fn`` that never returns: its worker holds decisions back for
    ``STARTING_PAUSE_S`` from its start, not for the rest of the run."""
    monitor, decided, sched, stuck = monitor_with_a_starting_worker()
    monitor.on_tick(sched)
    assert decided == []  # it may still be starting
    stuck.started -= STARTING_PAUSE_S  # ...and now it has been, for too long
    monitor.on_tick(sched)
    assert decided == []  # a fresh window begins without it
    monitor._last_scale -= HOUR
    monitor.on_tick(sched)
    assert decided == [sched]


def test_the_move_cost_counts_once_four_moves_measured_it_this_epoch():
    """A slow-lane move's forwarding cost is the mean over this epoch's moves, used once four
    were measured (one move may carry one-off costs); a new epoch measures afresh, so a cost
    that stopped moves once does not stop them for good."""
    opts = hr.Options(profile=False, autoscale=AutoscaleConfig(interval_s=HOUR))
    monitor = Monitor(opts, autoscale=True, step_names=None)
    monitor._autoscale = lambda _sched: None
    sched = fake_scheduler({})
    sched.counters.forwarded, sched.counters.forward_cpu_s = 3, 0.3
    monitor.on_tick(sched)
    assert monitor.move_cost_s == 0.0
    sched.counters.forwarded, sched.counters.forward_cpu_s = 4, 0.5
    monitor.on_tick(sched)
    assert monitor.move_cost_s == pytest.approx(0.125)
    monitor.on_tick(fake_scheduler({}))  # the next epoch's scheduler, no move yet
    assert monitor.move_cost_s == 0.0


def test_an_epoch_left_early_stores_no_consumer_rate():
    """An abandoned epoch is closed at the next iter() or later; the time in between is not
    the training loop's, so its rate would understate it."""
    monitor = Monitor(hr.Options(profile=False), autoscale=False, step_names=None)
    assert monitor.last_consumer_rate() is None
    monitor.epochs.append(SimpleNamespace(finished=True, samples=600, wall_s=4.0, stall_s=1.0))
    assert monitor.last_consumer_rate() == pytest.approx(200.0)
    monitor.epochs.append(SimpleNamespace(finished=False, samples=300, wall_s=60.0, stall_s=0.5))
    assert monitor.last_consumer_rate() is None
