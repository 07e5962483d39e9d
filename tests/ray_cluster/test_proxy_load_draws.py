"""With ``Remote(read_source=False)`` a remote worker's proxy loads the sample in the training
process, whose global random generators are the training loop's: not seeded per sample. A load
that draws from them is not shipped: the proxy hands the sample back to the local workers,
which load it again seeded (and, with the cache, know it drew); after a few such loads in a row
the proxies load no more, for the loader's life, and the remote workers are given no sample to
load (docs/design.md, "A proxy's load that draws").

Before, such a sample's load drew the training process's next numbers: it differed from an
all-local run in every epoch (with the cache too), and with the cache its decoded form, made
by the local workers after the split, was stored and served in the next epoch.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.remote.proxy_options import DRAWN_IN_A_ROW
from headrace.runtime.dispatch import DEPTH
from tests.helpers import ident_collate
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_ready

pytestmark = pytest.mark.ray

N = 48


class Src:
    """Sample ``i``'s load draws from a global generator for ``i`` in ``drawing`` (NumPy's,
    torch's or Python's, by ``i``); the others draw nothing."""

    def __init__(self, drawing: str) -> None:
        self.drawing = drawing

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> dict:
        x = np.full(4, float(i), np.float32)
        if self.drawing == "all" or i % 4 == 0:
            kind = i % 16 if self.drawing == "some" else 0
            if kind == 0:
                x += np.float32(np.random.random())
            elif kind == 4:  # one scalar: every other call is served from torch's cache
                x += np.float32(torch.randn(1).item())
            elif kind == 8:  # the same with NumPy's (legacy) cached Gaussian
                x += np.float32(np.random.standard_normal())
            else:
                x += np.float32(random.random())
        info = torch.utils.data.get_worker_info()
        return {"i": i, "x": x, "loaded_by": info.id if info is not None else -1}


def heavy(d: dict) -> dict:
    time.sleep(0.01)  # simulated work: the remote workers are worth their round trip
    return {**d, "x": d["x"] * 2}


def flip(d: dict, rng: np.random.Generator) -> dict:
    return {**d, "x": d["x"] + np.float32(rng.random())}


def _pipe(drawing: str) -> hr.Pipeline:
    return hr.Pipeline(Src(drawing), [hr.step(heavy), hr.step(flip, random=True)])


def _epochs(drawing: str, cache: bool, remote: hr.Remote | None = None,
            stop: int | None = None, started: list[int] | None = None
            ) -> tuple[list[dict[int, dict]], hr.DataLoader]:
    """Two epochs' samples by index, and the loader; ``started`` gets the remote workers each
    epoch's pool started with."""
    started = [] if started is None else started
    loader = hr.DataLoader(_pipe(drawing), batch_size=4, num_workers=1,
                           collate_fn=ident_collate,
                           options=hr.Options(seed=3, handoff=False, remote=remote,
                                              cache=hr.Cache(budget_bytes=16 << 20)
                                              if cache else None))
    if stop is not None:
        loader.remote.stop = stop  # what apply_offload sets for a remote range [1, stop)
    got = []
    try:
        for _ in range(2):
            it = iter(loader)
            if remote is not None:
                started.append(len(loader.remote.remote_workers(it.pool)))
                if not loader.remote.load_draws.stopped:
                    wait_ready(it, 2)  # (stopped: none are started, see the last test)
            got.append({s["i"]: s for b in it for s in b})
            del it
    finally:
        loader.close()
    return got, loader


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("drawing", "cache", "stop"),
                         [("some", True, 1), ("some", False, None), ("all", True, None)],
                         ids=["split_at_load_cached", "whole", "every_load_draws"])
def test_a_load_that_draws_runs_as_in_a_local_worker(ray_cluster, no_actor_leaks, drawing,
                                                     cache, stop, caplog):
    ref, _ = _epochs(drawing, cache=False)
    started: list[int] = []
    got, loader = _epochs(drawing, cache, hr.Remote(max_workers=2, read_source=False,
                                                    resources=ON_CPU_NODES), stop, started)
    for e in range(2):
        assert sorted(got[e]) == list(range(N))
        bad = [i for i in range(N) if not np.array_equal(got[e][i]["x"], ref[e][i]["x"])]
        assert not bad, f"epoch {e + 1}: samples {bad} differ from an all-local run"
    r = loader.remote
    assert r.load_drew > 0  # some loads were seen drawing, and those were loaded again
    if drawing == "some":  # the loads that draw nothing are still shipped, in every epoch
        assert r.not_loaded == 0
        assert any(s["loaded_by"] == -1 for s in got[0].values()), "no load ran in a proxy"
        assert all(s["loaded_by"] == 0 for i, s in got[0].items() if i % 4 == 0)
        if stop is None:
            assert r.remote_samples > 0
    else:  # every load draws: after DRAWN_IN_A_ROW, the proxies load no more
        assert all(s["loaded_by"] == 0 for e in range(2) for s in got[e].values())
        # for the loader's life: each epoch here has a pool of its own, and each paid
        # DRAWN_IN_A_ROW loads drawn (32 in all), the training loop's generators as many draws
        # (a proxy may be loading when another's load stops them: one more)
        assert DRAWN_IN_A_ROW <= r.load_drew <= DRAWN_IN_A_ROW + 2
        # the remote workers are given no sample once stopped: only one queued at a proxy
        # then comes back unloaded (before, each sample they took came back: 28 in one run)
        assert r.not_loaded <= 2 * DEPTH
        assert "the proxies load no more samples" in loader.explain()
        # and they are given back, not kept idle for the loader's life: the first epoch's
        # two are retired once the loads stop, the second epoch starts none (they idled to
        # the end of the epoch, and every later one started two more, idle)
        assert "retiring the 2 remote workers" in caplog.text
        assert started == [2, 0]
