"""AutoPlacement at run time: remote workers are added while they shorten batch time."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

import headrace as hr
from tests.helpers import ArraySource, busy
from tests.ray_cluster.test_remote import ON_CPU_NODES

pytestmark = pytest.mark.ray


def test_autoplace_adds_remote_workers_when_local_ones_stall(ray_cluster, no_actor_leaks):
    pipe = hr.Pipeline(ArraySource(400), [hr.step(busy, name="busy")])
    remote = hr.Remote(max_workers=2, resources=ON_CPU_NODES, autoplace=True, window=4)
    # no cache: with it, the later epochs' samples were hits (remote workers store none, so
    # only theirs ran again): epochs of a second or two, over before a remote worker started
    # (a flake hunt: 0 remote samples in 4 epochs where the first epoch's actor started late)
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1,
                           options=hr.Options(remote=remote, cache=None))
    assert loader.remote.target == 0  # before the first epoch nothing is started
    try:
        seen = Counter(int(v) // 2 for b in loader for v in b.flatten().tolist())
        assert seen == Counter(range(400))
        ctl = loader.remote.placement
        assert ctl is not None
        added = [m for _, m in ctl.moves if m.remote > 0]
        assert added, ctl.moves  # 1 local worker is the bottleneck: remote workers must be tried
        assert added[0].bpt > 0
        # a remote worker added late in an epoch may still be starting when it ends (a loaded
        # machine): the workers it added finish samples within a bounded number of epochs
        for _ in range(3):
            if loader.remote.remote_samples > 0:
                break
            assert sum(len(b) for b in loader) == 400
        assert loader.remote.remote_samples > 0
        assert ctl.timeline and all(p.bpt > 0 for p in ctl.timeline)
        text = loader.explain()
        assert "AutoPlacement (Pecan)" in text and "finished remotely" in text
    finally:
        loader.close()


def test_local_count_survives_a_new_pool(ray_cluster, no_actor_leaks):
    """Without persistent workers every epoch has a new pool of ``num_workers`` local workers:
    it starts at the local count the policy had reached instead."""
    pipe = hr.Pipeline(ArraySource(40), [hr.step(busy, name="busy")])
    remote = hr.Remote(max_workers=1, resources=ON_CPU_NODES, autoplace=True, window=1000)
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, options=hr.Options(remote=remote))
    assert sum(len(b) for b in loader) == 40
    ctl = loader.remote.placement
    assert ctl is not None and ctl.state.local == 2 and not ctl.moves  # window never ends
    ctl.state = dataclasses.replace(ctl.state, local=1)  # as a "remove a local worker" move
    it = iter(loader)
    local = [w for w in it.pool.workers.values() if not w.external and not w.retiring]
    assert len(local) == 1
    seen = Counter(int(v) // 2 for b in it for v in b.flatten().tolist())
    assert seen == Counter(range(40))
    loader.close()
