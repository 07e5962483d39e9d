"""``executor="auto"``'s decision from measured GIL holding (pure: no processes)."""

import math

import pytest

from headrace.planner.executor import MIN_PROBED_S, choose_executor, forced_processes


def test_waits_until_enough_step_time_was_probed():
    assert choose_executor(0.0, MIN_PROBED_S / 2, workers=4, cores=4) is None
    assert choose_executor(0.0, MIN_PROBED_S, workers=4, cores=4) is not None


def test_steps_that_release_the_gil_get_threads():
    d = choose_executor(0.1, 2.0, workers=4, cores=4)  # 5% held: ~20 threads' worth of room
    assert d is not None and d.executor == "threads"
    assert math.isclose(d.held_share, 0.05) and d.parallel == 4
    assert "threads save the copy" in d.describe()


def test_python_bound_steps_keep_processes():
    d = choose_executor(1.9, 2.0, workers=4, cores=4)  # 95% held: about one thread's worth
    assert d is not None and d.executor == "processes"
    assert "under 0.9 × the 4 processes" in d.reason


def test_the_parallelism_processes_would_get_sets_the_bar():
    # 40% held: 2.5 threads' worth. Enough on 2 cores, not on 8.
    assert choose_executor(0.8, 2.0, workers=8, cores=2).executor == "threads"
    assert choose_executor(0.8, 2.0, workers=8, cores=8).executor == "processes"
    # fewer workers than cores: the workers are the bar
    assert choose_executor(0.8, 2.0, workers=2, cores=8).executor == "threads"


def test_never_held_and_forced():
    d = choose_executor(0.0, 1.5, workers=2, cores=2)
    assert d.executor == "threads" and "released the GIL all the time" in d.reason
    f = forced_processes("worker_init_fn needs worker processes")
    assert f.executor == "processes" and math.isnan(f.held_share)
    assert "worker_init_fn" in f.describe()


def test_threads_first_epoch_is_a_trial_against_the_last_epoch_on_processes():
    from headrace.planner.executor import after_trial

    d = choose_executor(0.16, 1.0, workers=2, cores=2)  # CIFAR-sized NumPy read as 16% held
    assert d is not None and d.executor == "threads"
    assert after_trial(d, 9000.0, 10000.0) is d  # 0.9x: kept (no copy, no process per worker)
    back = after_trial(d, 3300.0, 7400.0)
    assert back.executor == "processes" and back.held_share == d.held_share
    assert "3300 samples/s against 7400 on processes (0.45x)" in back.reason


def test_the_trial_compares_the_first_long_enough_threads_epoch_once():
    from headrace.runtime.executor_auto import ExecutorProbes

    threads = choose_executor(0.16, 1.0, workers=2, cores=2)
    probes = ExecutorProbes()
    assert probes.after_epoch("processes", 0.5, 9000.0, None) is None  # too short to count
    assert probes.after_epoch("processes", 2.0, 7400.0, threads) is threads
    assert probes.after_epoch("threads", 0.5, 100.0, threads) is threads  # too short to tell
    back = probes.after_epoch("threads", 6.0, 3300.0, threads)
    assert back is not None and back.executor == "processes"
    # once tried, never again: a later threads epoch (forced by nobody) is not re-judged
    assert probes.after_epoch("threads", 6.0, 100.0, threads) is threads


def test_a_draw_seen_after_threads_were_chosen_still_keeps_processes():
    from types import SimpleNamespace

    from headrace.runtime.executor_auto import ExecutorProbes

    class Pool:  # what decide() reads of a WorkerPool (weakly referenced, as pools are)
        progress = SimpleNamespace(gil_held=[0.05, 0.05], gil_probed=[0.6, 0.6],
                                   global_draw=[0, 0], worker_info_read=[0, 0],
                                   state_changed=[0, 0], state_attr=b"\0" * 128)
        own_workers = 2
        pipeline = SimpleNamespace(step_names=["load", "flip"])

    pool = Pool()
    progress = pool.progress
    probes = ExecutorProbes()
    first = probes.decide(pool, None)
    assert first is not None and first.executor == "threads"
    assert probes.decide(pool, first) is first  # nothing new: as it was
    progress.global_draw[1] = 2  # worker 1 saw step 1 ("flip") draw, after the choice
    later = probes.decide(pool, first)
    assert later is not None and later.executor == "processes" and "'flip'" in later.reason


@pytest.mark.parametrize("seen, said", [("worker_info_read", "calls get_worker_info()"),
                                        ("global_draw", "draws from a global random generator"),
                                        ("state_changed", "set its attribute 'handle'")])
def test_what_threads_would_change_keeps_processes_also_when_seen_at_the_epoch_end(seen, said):
    from types import SimpleNamespace

    from headrace.runtime.executor_auto import ExecutorProbes

    class Pool:  # what decide() reads of a WorkerPool (weakly referenced, as pools are)
        progress = SimpleNamespace(gil_held=[0.05, 0.05], gil_probed=[0.6, 0.6],
                                   global_draw=[0, 0], worker_info_read=[0, 0],
                                   state_changed=[0, 0], state_attr=b"handle".ljust(64, b"\0") * 2)
        own_workers = 2
        pipeline = SimpleNamespace(step_names=["load", "decode", "shard"])

    pool = Pool()
    probes = ExecutorProbes()
    first = probes.decide(pool, None)
    assert first is not None and first.executor == "threads"
    # worker 0 saw step 2 ("shard") do it in the epoch's last sample: the scheduler decides
    # no more once that sample is in, the epoch's close reads it
    getattr(pool.progress, seen)[0] = 3
    after = probes.after_epoch("processes", 2.0, 500.0, first)
    assert after is not None and after.executor == "processes"
    assert f"step 'shard' {said}" in after.reason
    assert probes.decide(pool, after) is after  # kept


def test_the_decision_counts_the_pools_own_workers_not_its_remote_ones(monkeypatch):
    # threads share this process's GIL: only the pool's own workers would run as threads
    # (pool.size counts a backend's remote proxies too: 2 local + 2 remote on 8 cores read as
    # 4 in parallel, and steps holding the GIL 30% of their time went to processes)
    from types import SimpleNamespace

    from headrace.runtime import executor_auto
    from headrace.runtime.executor_auto import ExecutorProbes

    class Pool:  # what decide() reads of a WorkerPool (weakly referenced, as pools are)
        progress = SimpleNamespace(gil_held=[3.0, 3.0], gil_probed=[10.0, 10.0],
                                   global_draw=[0, 0], worker_info_read=[0, 0],
                                   state_changed=[0, 0], state_attr=b"\0" * 128)
        size = 4
        own_workers = 2
        pipeline = SimpleNamespace(step_names=["load", "decode"])

    monkeypatch.setattr(executor_auto, "rank_cpus", lambda: 8)
    d = ExecutorProbes().decide(Pool(), None)
    assert d is not None and d.executor == "threads" and d.parallel == 2


def test_short_epochs_are_added_up_until_a_rate_can_be_taken():
    from headrace.planner.executor import TRIAL_MIN_S, pooled_rate

    window, rate = pooled_rate((0.0, 0.0), 160.0, 0.4)
    assert rate is None and window == (160.0, 0.4)
    window, rate = pooled_rate(window, 160.0, 0.4)
    assert rate is None  # 0.8 s
    window, rate = pooled_rate(window, 240.0, 0.4, min_s=TRIAL_MIN_S)
    assert window == (0.0, 0.0) and rate == pytest.approx(560.0 / 1.2)


def test_a_job_of_short_epochs_still_tries_threads_and_goes_back():
    # a hunt: the probe read a pure-Python step as 55% held, auto chose threads, and with
    # epochs under TRIAL_MIN_S each the trial never ran: 400 samples/s against 700 for good
    from headrace.runtime.executor_auto import ExecutorProbes

    threads = choose_executor(0.55, 1.0, workers=2, cores=2)
    assert threads is not None and threads.executor == "threads"
    probes = ExecutorProbes()
    assert probes.after_epoch("processes", 0.6, 700.0, threads) is threads
    assert probes.after_epoch("processes", 0.6, 700.0, threads) is threads
    assert probes.after_epoch("threads", 0.6, 400.0, threads) is threads  # 0.6 s: not yet
    back = probes.after_epoch("threads", 0.6, 400.0, threads)  # 1.2 s of threads
    assert back is not None and back.executor == "processes"
    assert "400 samples/s against 700 on processes" in back.reason


def test_one_short_processes_epoch_before_threads_still_gives_the_trial_its_rate():
    # a review: 2 busy workers decide within half a second, so processes may have run one
    # 0.6 s epoch only; its window was dropped at the switch and threads stayed for good
    from headrace.runtime.executor_auto import ExecutorProbes

    threads = choose_executor(0.55, 1.0, workers=2, cores=2)
    probes = ExecutorProbes()
    assert probes.after_epoch("processes", 0.6, 700.0, threads) is threads
    d = threads
    for _ in range(10):  # the loader runs threads while the decision says so
        if d is None or d.executor != "threads":
            break
        d = probes.after_epoch("threads", 0.6, 400.0, d)
    assert d is not None and d.executor == "processes"
    assert "400 samples/s against 700 on processes" in d.reason


def test_explain_states_the_margin_threads_are_chosen_with():
    # 53% held: 1.9 threads' worth, which "enough for the 2" read as an arithmetic slip
    d = choose_executor(0.53, 1.0, workers=2, cores=2)
    assert d is not None and d.executor == "threads"
    assert "about 1.9 at once, at least 0.9 × the 2 that min(workers, cores) allows" \
        in d.describe()
