"""What the remote side counts (``RemoteSession.remote_samples``, ``handed_off_remote``): the
results the scheduler took, each as it ran, on the session's real Ray cluster."""

from __future__ import annotations

import fcntl
import functools
import math
import os
from collections import Counter

import pytest

import headrace as hr
from headrace.planner.offload import Candidate, OffloadDecision
from tests.helpers import ArraySource, ident_collate, ran_at, wait_at_gate
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_until

pytestmark = pytest.mark.ray

N = 40


def gated_ran_at(gate: str, held: str, key: str, x):
    """``ran_at`` (no simulated work), first waiting at the gate (``wait_at_gate``)."""
    wait_at_gate(gate, held)
    return ran_at(key, 0.0, x)


class Gate:
    """A gate the test holds closed (an exclusive ``flock``) until ``open``; steps wait at it
    and say which process waits (``held``)."""

    def __init__(self, tmp_path) -> None:
        self.path, self.held = tmp_path / "gate", tmp_path / "held"
        self.held.mkdir()
        self._lock = open(self.path, "w")  # noqa: SIM115 - released by open() or close()
        fcntl.flock(self._lock, fcntl.LOCK_EX)

    def step(self, key: str):
        return functools.partial(gated_ran_at, str(self.path), str(self.held), key)

    def remote_holds(self, it) -> bool:
        """A process other than the training process and its local workers waits at it."""
        ours = {os.getpid()} | {w.process.pid for w in list(it.pool.workers.values())
                                if not w.external and w.process.pid is not None}
        return any(int(f) not in ours for f in os.listdir(self.held))

    def open(self) -> None:
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        self.path.unlink()

    def close(self) -> None:
        self._lock.close()


@pytest.mark.timeout(180)
def test_results_dropped_as_stale_are_not_counted(ray_cluster, no_actor_leaks, tmp_path):
    # The proxy counted each result as it posted it; the scheduler then dropped some as stale
    # (here: the samples an epoch ended early left in flight, which reach the next epoch),
    # so remote_samples counted samples never delivered.
    gate = Gate(tmp_path)
    pipe = hr.Pipeline(ArraySource(N), [hr.step(gate.step("a"), name="a")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           persistent_workers=True, options=hr.Options(seed=3, remote=hr.Remote(
                               max_workers=2, resources=ON_CPU_NODES)))
    try:
        it = iter(loader)
        wait_until(lambda it=it: gate.remote_holds(it))
        del it  # the epoch ends with a remote worker's sample in flight: stale in the next
        gate.open()
        got = [s for b in loader for s in b]
        assert Counter(s["i"] for s in got) == Counter(range(N))  # exactly once
        # get_worker_info().id: 0 in the local worker, 1 or 2 in a remote one
        assert loader.remote.remote_samples == sum(s["a"][1] >= 1 for s in got)
    finally:
        gate.close()
        loader.close()


def split_at(stop: int) -> OffloadDecision:
    """A decision that runs steps ``[0, stop)`` remotely for every sample (as a replan makes)."""
    best = Candidate(start=0, stop=stop, rthp=100.0, ocycle=0.0, estimate=100.0)
    return OffloadDecision(offload=True, reason="test", gthp=math.inf, lthp=10.0, pcycle=0.1,
                           best=best, ratio=1.0, predicted=100.0)


@pytest.mark.timeout(180)
def test_a_sample_back_at_the_split_it_ran_with_counts_as_offloaded(ray_cluster, no_actor_leaks,
                                                                   tmp_path):
    # A replan moved the split later while a remote worker ran a sample up to the old one:
    # compared with the new split, the sample it handed back counted as handed off over the
    # timeout, not as offloaded.
    gate = Gate(tmp_path)
    pipe = hr.Pipeline(ArraySource(N), [hr.step(gate.step("a"), name="a"),
                                        hr.step(functools.partial(ran_at, "b", 0.0), name="b")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=3, remote=hr.Remote(
                               max_workers=2, resources=ON_CPU_NODES)))
    loader.remote.stop = 2  # remote workers run load -> a, local workers b
    try:
        it = iter(loader)
        wait_until(lambda it=it: gate.remote_holds(it))  # sent with the split at 2
        loader.remote.apply_offload(split_at(3))  # the whole sample remotely from now on
        gate.open()
        got = [s for b in it for s in b]
        assert Counter(s["i"] for s in got) == Counter(range(N))  # exactly once
        assert loader.remote.handed_off_remote == 0  # no timeout was learned: none went slow
        # each sample whose step "a" (before both splits) ran remotely counts once, also one
        # handed back at the old split that a remote worker then finished (it counted twice);
        # local workers run every step of what they take, so no other sample ran remotely
        assert loader.remote.remote_samples == sum(s["a"][1] >= 1 for s in got) > 0
        del it
    finally:
        gate.close()
        loader.close()
