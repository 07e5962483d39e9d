"""Pecan's AutoPlacement (planner/placement.py) on synthetic batch-time traces."""

import dataclasses
import math

import pytest

from headrace.planner.placement import Move, PlacementConfig, PlacementState, observe


def system(model_s=0.10, work_s=1.0, cores=2, contention=0.05):
    """Batch time of a synthetic job: a batch needs ``work_s`` worker-seconds; local workers
    beyond ``cores`` slow every batch by ``contention`` each; the model needs ``model_s``."""
    def bpt(local: int, remote: int) -> float:
        capacity = min(local, cores) + remote  # worker-seconds per second
        prep = work_s / capacity if capacity else float("inf")
        return max(model_s, prep) * (1 + contention * max(0, local - cores))
    return bpt


def run(cfg, bpt, local=1, remote=0, batches=4000, change_at=None, after=None, s=None):
    """Feed ``batches`` batch times; returns the last state in the watch phase (the converged
    configuration: the run may end during a try of one remote worker fewer) and the moves."""
    s = PlacementState(local=local, remote=remote) if s is None else s
    moves: list[Move] = []
    watched = None
    for i in range(batches):
        f = after if change_at is not None and i >= change_at else bpt
        s, m = observe(cfg, s, f(s.local, s.remote))
        if m is not None:
            moves.append(m)
        if s.phase == "watch":
            watched = s
        assert 0 <= s.remote <= cfg.max_remote and cfg.min_local <= s.local <= cfg.max_local
    assert watched is not None, "never converged"
    return watched, moves


def test_windows_and_unstable_windows():
    cfg = PlacementConfig(max_remote=4, max_local=2, window=5, unstable_windows=2)
    s = PlacementState(local=1, remote=0)
    for _ in range(4):
        s, m = observe(cfg, s, 1.0)
        assert m is None
    s, m = observe(cfg, s, 1.0)  # first full window: start adding remote workers
    assert m is not None and m.remote == 1 and s.skip == 2
    for _ in range(10):  # two discarded windows
        s, m = observe(cfg, s, 0.5)
        assert m is None
    assert s.skip == 0


def test_converges_to_fewest_workers_at_the_model_bound_without_costs():
    # 1.0 s of work per batch, model 0.1 s: 10 workers of capacity needed, 2 of them local
    cfg = PlacementConfig(max_remote=16, max_local=4, window=10)
    s, moves = run(cfg, system())
    assert s.phase == "watch"
    assert (s.local, s.remote) == (2, 8)
    assert system()(s.local, s.remote) == pytest.approx(0.1)
    assert any("contention" in m.reason for m in moves)


def test_with_costs_drops_remote_workers_that_do_not_pay():
    # remote workers cost as much as the whole training host: a slightly slower job is cheaper
    cfg = PlacementConfig(max_remote=16, max_local=4, window=10, local_cost=1.0, remote_cost=1.0)
    s, _ = run(cfg, system(model_s=0.1, work_s=1.0))
    bpt = system(model_s=0.1, work_s=1.0)
    cost = cfg.bpc(bpt(s.local, s.remote), s.remote)
    assert s.phase == "watch"
    for r in range(0, 17):  # no other remote count (with 2 local) is cheaper
        assert cost <= cfg.bpc(bpt(2, r), r) + 1e-12
    # cheap remote workers: the cost optimum is the stall-free configuration again
    cheap = PlacementConfig(max_remote=16, max_local=4, window=10, local_cost=100.0,
                            remote_cost=1.0)
    s, _ = run(cheap, bpt)
    assert (s.local, s.remote) == (2, 8)


def test_no_stall_adds_nothing_for_good():
    cfg = PlacementConfig(max_remote=8, max_local=2, window=10)
    s, _ = run(cfg, system(model_s=1.0, work_s=0.5), local=1)  # 1 local worker keeps up
    assert s.phase == "watch" and s.remote == 0


def test_reacts_to_a_phase_change():
    cfg = PlacementConfig(max_remote=16, max_local=2, window=10)
    light, heavy = system(work_s=0.4), system(work_s=1.2)
    s, moves = run(cfg, light, batches=6000, change_at=3000, after=heavy)
    assert s.phase == "watch"
    assert heavy(s.local, s.remote) == pytest.approx(0.1)
    assert (s.local, s.remote) == (2, 10)
    assert any("phase change" in m.reason for m in moves)


def test_local_workers_at_their_maximum_keep_the_re_added_remote_worker():
    """The remote benchmark's case: 1 local worker and no room for another, costs 4 (host) and
    1 (remote worker) per hour, 0.32 worker-seconds per batch, model 40 ms. The cheapest
    stall-free point is 7 remote workers. Removing the 7th makes batches costlier: it is
    re-added and the policy converges there, instead of removing another one in the same move
    (a net-zero move that kept the costlier configuration and ratcheted down to none)."""
    cfg = PlacementConfig(max_remote=8, max_local=1, window=10, local_cost=4.0,
                          remote_cost=1.0)
    bpt = system(model_s=0.04, work_s=0.32, cores=1)
    s, moves = run(cfg, bpt)
    assert s.phase == "watch"
    assert (s.local, s.remote) == (1, 7)
    assert all(m.local or m.remote for m in moves)  # no move that changes nothing


def test_one_noisy_window_after_converging_is_not_a_phase_change():
    """Converged at the edge of the accelerator's rate, a single slow window (noise, not a new
    phase) leaves the configuration as it is; the same slowdown two windows in a row is a
    phase change."""
    cfg = PlacementConfig(max_remote=8, max_local=1, window=10, local_cost=4.0,
                          remote_cost=1.0)
    bpt = system(model_s=0.04, work_s=0.32, cores=1)
    s, _ = run(cfg, bpt)
    assert s.phase == "watch" and (s.local, s.remote) == (1, 7)
    for _ in range(cfg.window):  # one window 10% above the settled batch time
        s, m = observe(cfg, s, bpt(1, 7) * 1.1)
    assert m is None and s.phase == "watch" and s.drift == 1
    for _ in range(cfg.window):  # back to normal: the count starts again
        s, m = observe(cfg, s, bpt(1, 7))
    assert m is None and s.drift == 0
    for _ in range(2 * cfg.window):  # slower two windows in a row: the policy starts again
        s, m = observe(cfg, s, bpt(1, 7) * 1.1)
        if m is not None:
            break
    assert m is not None and "phase change" in m.reason and m.remote == 1


def test_tries_neighbours_again_and_backs_off_when_undone():
    """Converged: every ``reprobe_windows`` quiet windows the policy tries one remote worker
    fewer, then one more, in turn; on this steady trace each try costs more and is undone,
    and the wait between tries doubles up to ``reprobe_max_windows``."""
    cfg = PlacementConfig(max_remote=8, max_local=1, window=10, local_cost=4.0,
                          remote_cost=1.0, reprobe_windows=4, reprobe_max_windows=16)
    bpt = system(model_s=0.04, work_s=0.32, cores=1)
    s, moves = run(cfg, bpt, batches=6000)
    assert (s.local, s.remote) == (1, 7)
    tries = [i for i, m in enumerate(moves) if "quiet windows: try" in m.reason]
    assert len(tries) >= 4
    for n, i in enumerate(tries):  # fewer, more, fewer, ...: each undone by the next move
        fewer = n % 2 == 0
        assert ("fewer" if fewer else "more") in moves[i].reason
        assert moves[i].remote == (-1 if fewer else 1)
        if i + 1 == len(moves):  # the run may end during the last try
            break
        assert moves[i + 1].remote == -moves[i].remote
        assert ("costlier" if fewer else "did not make batches cheaper") in moves[i + 1].reason
    waits = [int(moves[i].reason.split()[0]) for i in tries]
    assert waits[:4] == [4, 8, 16, 16]
    off = PlacementConfig(max_remote=8, max_local=1, window=10, local_cost=4.0,
                          remote_cost=1.0, reprobe_windows=0)
    _, moves = run(off, bpt, batches=6000)
    assert not any("quiet windows" in m.reason for m in moves)


def test_a_slow_window_while_removing_is_corrected_by_a_later_try():
    """The remote benchmark's failure: one slow window (another process, not the removal)
    right after the first removal makes it look costlier; the policy re-adds the worker and
    converges one worker above the cheapest configuration. A later try, in quiet conditions,
    finds the cheaper configuration and keeps it."""
    cfg = PlacementConfig(max_remote=8, max_local=1, window=10, local_cost=4.0,
                          remote_cost=1.0, reprobe_windows=4)
    bpt = system(model_s=0.04, work_s=0.32, cores=1)
    s = PlacementState(local=1, remote=0)
    removals = 0
    seen: list[tuple[int, int]] = []
    for _ in range(8000):
        slow = removals == 1 and s.phase == "remove_remote"  # the first removal's window
        s, m = observe(cfg, s, bpt(s.local, s.remote) * (1.3 if slow else 1.0))
        if m is not None and m.remote < 0:
            removals += 1
        if s.phase == "watch" and (not seen or seen[-1] != (s.local, s.remote)):
            seen.append((s.local, s.remote))
    assert seen[0] == (1, 8)  # fooled by the slow window: one worker too many
    assert seen[-1] == (1, 7)  # the cheapest stall-free configuration, found by a later try


def test_a_slow_window_before_a_removal_is_corrected_by_a_later_try():
    """The other direction (seen on the remote benchmark): the window at the cheapest
    configuration is slow, so adding stops there and the removal compared with that window
    looks free: the policy converges one worker short, stalling; a later try of one worker
    more finds batches cheaper and keeps it."""
    cfg = PlacementConfig(max_remote=12, max_local=1, window=10, local_cost=4.0,
                          remote_cost=1.0, reprobe_windows=4)
    bpt = system(model_s=0.04, work_s=0.36, cores=1)  # stall-free from 8 remote workers
    best = min(range(13), key=lambda r: cfg.bpc(bpt(1, r), r))
    assert best == 8 and bpt(1, 7) > 1.1 * bpt(1, 8)
    s = PlacementState(local=1, remote=0)
    seen: list[tuple[int, int]] = []
    slowed = False
    for _ in range(8000):
        # the first window at 8 remote workers: adding stops there (not faster than 7) and
        # the first removal is compared with it
        slow = not slowed and s.phase == "add_remote" and s.remote == 8 and s.skip == 0
        slowed = slowed or (slow and s.n == cfg.window - 1)
        s, _ = observe(cfg, s, bpt(s.local, s.remote) * (1.3 if slow else 1.0))
        if s.phase == "watch" and (not seen or seen[-1] != (s.local, s.remote)):
            seen.append((s.local, s.remote))
    assert slowed
    assert seen[0] == (1, 7)  # fooled by the slow window: one worker short, batches stall
    assert seen[-1] == (1, 8)  # the cheapest configuration, found by a later try


def test_the_converged_batch_time_is_a_running_mean():
    """A lucky first window after converging does not become the reference: ordinary windows
    (4.6% above it, within T of the configuration's usual batch time) are no phase change;
    a real one still is."""
    cfg = PlacementConfig(max_remote=8, max_local=1, window=10, local_cost=4.0,
                          remote_cost=1.0, reprobe_windows=0)
    bpt = system(model_s=0.04, work_s=0.32, cores=1)
    s, _ = run(cfg, bpt)
    s = dataclasses.replace(s, settled=math.inf, settled_n=0)
    for w, factor in enumerate([0.98] + [1.025] * 10):  # first window 2% fast
        for _ in range(cfg.window):
            s, m = observe(cfg, s, bpt(1, 7) * factor)
            assert m is None, (w, m)
    assert s.settled == pytest.approx(bpt(1, 7) * 1.025, rel=0.01)
    for _ in range(2 * cfg.window):  # 10% slower two windows in a row: a phase change
        s, m = observe(cfg, s, bpt(1, 7) * 1.13)
        if m is not None:
            break
    assert m is not None and "phase change" in m.reason
