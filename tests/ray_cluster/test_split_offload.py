"""FastFlow's split with an offload ratio: remote workers run the prefix of at most ``ratio`` of
the samples, local workers run the rest of every sample."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

import headrace as hr
from headrace.runtime.dispatch import DEPTH
from tests.helpers import ArraySource, ident_collate, ran_at
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_ready

pytestmark = pytest.mark.ray

N, RATIO, WORKERS = 120, 0.25, 2


@pytest.mark.timeout(180)
@pytest.mark.parametrize("slow_lane", [False, True])
def test_local_suffix_stays_local_and_the_ratio_holds(ray_cluster, no_actor_leaks, slow_lane):
    # Samples handed back at the split went to the slow lane, where remote workers took them
    # too and ran the local suffix (their stop became start + 1), and only samples finished
    # remotely counted against the ratio: 63 of 120 ran step a remotely with a cap of 32.
    pipe = hr.Pipeline(ArraySource(N), [hr.step(functools.partial(ran_at, "a", 0.03), name="a"),
                                        hr.step(functools.partial(ran_at, "b", 0.005), name="b")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=3, remote=hr.Remote(
                               max_workers=WORKERS, resources=ON_CPU_NODES,
                               slow_lane=slow_lane)))
    loader.remote.stop, loader.remote.ratio = 2, RATIO  # what apply_offload sets for [0, 2)
    it = iter(loader)
    try:
        wait_ready(it, WORKERS)
        got = [s for b in it for s in b]
        assert Counter(s["i"] for s in got) == Counter(range(N))  # exactly once
        # get_worker_info().id: 0 in the local worker process, 1.. in a remote actor
        assert all(s["b"][1] == 0 for s in got), "the local suffix ran on a remote worker"
        offloaded = sum(s["a"][1] >= 1 for s in got)
        # the ratio plus one per remote worker, and the gate is asked once a dispatch pass:
        # a pass it lets through fills a remote worker's queue (DEPTH), one more each
        assert 0 < offloaded <= RATIO * N + WORKERS * DEPTH
        assert loader.remote.remote_samples == offloaded
    finally:
        del it
        loader.close()
