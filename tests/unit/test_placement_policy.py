"""Pecan's AutoPlacement (planner/placement.py) on synthetic batch-time traces."""

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


def run(cfg, bpt, local=1, remote=0, batches=4000, change_at=None, after=None):
    s = PlacementState(local=local, remote=remote)
    moves: list[Move] = []
    for i in range(batches):
        f = after if change_at is not None and i >= change_at else bpt
        s, m = observe(cfg, s, f(s.local, s.remote))
        if m is not None:
            moves.append(m)
        assert 0 <= s.remote <= cfg.max_remote and cfg.min_local <= s.local <= cfg.max_local
    return s, moves


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
