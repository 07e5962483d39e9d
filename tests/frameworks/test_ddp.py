"""Plain ``torchrun`` DDP with a ``DistributedSampler``: every rank takes the same number of
batches each epoch (no rank waits at the end: each batch is followed by an ``all_reduce``),
each rank gets exactly its share, shares cover the dataset; uneven sizes, ``drop_last`` on and
off, ``on_error="skip"``; worker budget divided among the node's ranks; a warning when a rank
would iterate the whole dataset. The ranks run ``scripts/ddp_ranks.py``."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

from tests.frameworks.conftest import load_json, run_script

pytestmark = [pytest.mark.frameworks, pytest.mark.integration]

BAD = {"skip": {0, 4, 5}, "skip_drop_last": {0, 4, 5}}
DROP_LAST = {"uneven_drop_last", "skip_drop_last"}
SIZES = {"even": (48, 4), "uneven": (29, 4), "uneven_drop_last": (29, 4), "skip": (32, 3),
         "skip_drop_last": (32, 3)}


def strip_repeats(batches):
    """The rank's own batches: without the trailing repeats of its last batch."""
    out = list(batches)
    while len(out) > 1 and out[-1] == out[-2]:
        out.pop()
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_take_equal_batches_and_their_exact_share(tmp_path, world):
    run_script("ddp_ranks.py", str(tmp_path), timeout_s=400,
               launcher=[sys.executable, "-m", "torch.distributed.run", "--standalone",
                         f"--nproc_per_node={world}"])
    ranks = [load_json(tmp_path / f"rank{r}.json") for r in range(world)]
    assert all(r["world"] == world for r in ranks)
    repeated = 0
    for case, (n, bs) in SIZES.items():
        bad = BAD.get(case, set())
        for epoch in (0, 1):
            per_rank = [r["cases"][case][epoch] for r in ranks]
            counts = {len(p["batches"]) for p in per_rank}
            assert counts == {per_rank[0]["len"]}, (case, epoch, counts)  # same count everywhere
            covered = set()
            for p in per_rank:
                own = strip_repeats(p["batches"])
                repeated += len(p["batches"]) - len(own)
                assigned = p["assigned"]  # this rank's DistributedSampler share
                kept = assigned[: len(assigned) - len(assigned) % bs] if case in DROP_LAST else assigned
                want = Counter(i for i in kept if i not in bad)
                got = Counter(i for b in own for i in b)
                if case in DROP_LAST:  # full batches only: a remainder left by skips is dropped
                    assert all(len(b) == bs for b in own), (case, epoch)
                    n_want = sum(want.values())
                    assert got <= want and sum(got.values()) == n_want - n_want % bs, (case, epoch)
                else:
                    assert got == want, (case, epoch)
                    assert all(len(b) == bs for b in own[:-1])
                covered |= set(want)
            if case not in DROP_LAST:
                assert covered == set(range(n)) - bad  # shares cover the dataset
        if not bad:
            e0, e1 = (set(ranks[0]["cases"][case][e]["assigned"]) for e in (0, 1))
            assert e0 != e1  # set_epoch: a new split each epoch
    assert repeated > 0  # rank 0 lost two samples of the skip case: its last batch was repeated
    for r in ranks:
        assert r["in_order_same_as_torch"]
        assert r["shuffled_is_sample_aware"]  # DistributedSampler(shuffle=True): regrouped
    for r in ranks:  # a default sampler: the whole dataset on every rank, and one warning
        assert r["plain"] == list(range(8))
        assert len(r["plain_warnings"]) == 1 and "DistributedSampler" in r["plain_warnings"][0]
        assert r["cpus"]["rank"] == max(1, r["cpus"]["node"] // world)  # LOCAL_WORLD_SIZE share
        assert r["cpus"]["auto_workers"] <= r["cpus"]["rank"]
