"""A remote worker does not hand a sample back at its split point when the value there would
not arrive as it is (``runtime/faithful.py``): it finishes the sample itself. FastFlow's split
and SOPHON's storage-side prefixes hand values back through the same ``TaskRunner``."""

from __future__ import annotations

import pytest
import torch

import headrace as hr
from tests.helpers import ident_collate
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_ready

pytestmark = pytest.mark.ray

N, WORKERS = 48, 2


class Full:
    """Sample ``i``: an 8x8 tensor of ``i``."""

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> torch.Tensor:
        return torch.full((8, 8), float(i))


def split(x: torch.Tensor) -> dict:
    """Even samples: a view of the image and the image itself under other keys; odd samples:
    copies (those are still handed back at the split)."""
    i = int(x[0, 0])
    if i % 2 == 0:
        return {"i": i, "img": x, "top": x[:2], "same": x}
    return {"i": i, "img": x, "top": x[:2].clone(), "same": x.clone()}


def brighten(d: dict) -> dict:
    d["img"].mul_(2)  # in place: "top" and "same" see it where they share its memory
    return d


def sums(d: dict) -> tuple[int, float, float, float, bool]:
    """The sums, and whether a remote worker ran this step (``get_worker_info().id``: 0 in
    the local worker process, 1.. in a remote actor)."""
    remote = torch.utils.data.get_worker_info().id >= 1
    return d["i"], float(d["img"].sum()), float(d["top"].sum()), float(d["same"].sum()), remote


def _pipe() -> hr.Pipeline:
    return hr.Pipeline(Full(), [hr.step(split), hr.step(brighten), hr.step(sums)])


@pytest.mark.timeout(180)
def test_a_value_sharing_memory_at_the_split_is_finished_remotely(ray_cluster, no_actor_leaks):
    local = hr.DataLoader(_pipe(), batch_size=4, num_workers=1, collate_fn=ident_collate,
                          options=hr.Options(seed=2))
    expected = sorted(s[:4] for b in local for s in b)
    loader = hr.DataLoader(_pipe(), batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=2, remote=hr.Remote(
                               max_workers=WORKERS, resources=ON_CPU_NODES)))
    loader.remote.stop = 2  # remote workers run [load, split] and hand the value back
    it = iter(loader)
    try:
        wait_ready(it, WORKERS)
        got = [s for b in it for s in b]
    finally:
        del it
        loader.close()
    assert sorted(s[:4] for s in got) == expected
    # even samples ran the rest remotely; odd ones, which share nothing, were handed back
    assert any(s[4] for s in got if s[0] % 2 == 0)
    assert not any(s[4] for s in got if s[0] % 2 == 1)
