"""The worker scaler's first window starts once every worker runs: a window with a worker
still starting (its fork and imports, the cores idle while it initialises) read CPU-bound
imagenet's cores as unsaturated and added a third worker on 2 cores (``Monitor.on_tick``)."""

import queue
from types import SimpleNamespace

import headrace as hr
from headrace.runtime.monitor import Monitor


def fake_scheduler(workers):
    pool = SimpleNamespace(workers=workers, handoff=SimpleNamespace(timeout=SimpleNamespace(value=0.0)),
                           executor="processes")
    spec = SimpleNamespace(handoff=False, max_in_flight=8,
                           batcher=SimpleNamespace(batch_size=4, ready_samples=0))
    return SimpleNamespace(pool=pool, spec=spec, out=queue.Queue(), in_flight=0, slow_backlog=0)


def test_no_decision_while_a_worker_starts_and_a_full_window_after():
    monitor = Monitor(hr.Options(profile=False), autoscale=True, step_names=None)
    decided = []
    monitor._autoscale = decided.append
    starting = SimpleNamespace(ready=False, retiring=False, external=False)
    running = SimpleNamespace(ready=True, retiring=False, external=False)
    sched = fake_scheduler({0: running, 1: starting})
    interval = monitor.scaler.cfg.interval_s

    monitor._last_scale -= 10 * interval  # a decision is long due...
    monitor.on_tick(sched)
    assert decided == []  # ...but worker 1 still starts: none, and the window restarts
    starting.ready = True
    monitor.on_tick(sched)
    assert decided == []  # every worker runs now: the window began at the last tick
    monitor._last_scale -= interval
    monitor.on_tick(sched)
    assert decided == [sched]
    # retiring and external (remote) workers do not hold the scaler back
    sched.pool.workers[2] = SimpleNamespace(ready=False, retiring=True, external=False)
    sched.pool.workers[3] = SimpleNamespace(ready=False, retiring=False, external=True)
    monitor._last_scale -= interval
    monitor.on_tick(sched)
    assert decided == [sched, sched]
