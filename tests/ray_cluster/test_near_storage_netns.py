"""Near-storage preprocessing over a real shaped link: the storage node runs in its own network
namespace behind a veth pair limited with ``tc``; bytes are read from the interface counters."""

from __future__ import annotations

import pytest
import torch

import headrace as hr
from headrace.workloads import storage_images as si
from tests.helpers import ident_collate
from tests.ray_cluster.conftest import SHAPED_CPUS, SHAPED_MBIT, SHAPED_RESOURCE
from tests.ray_cluster.test_remote import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.netns]

N = 64
SCALE = 0.5  # long sides ~500 px, crop 112 px: ~5 MB raw per epoch, ~2 s at 20 Mbit/s


def epochs_over_link(node, policy: str, epochs: int = 2):
    """Run ``epochs`` epochs; per epoch: samples by index and bytes the link carried."""
    opts = hr.Options(seed=9, cache=None, remote=hr.NearStorage(
        policy=policy, bandwidth=SHAPED_MBIT * 1e6 / 8, max_workers=SHAPED_CPUS,
        resources={SHAPED_RESOURCE: 1}))
    loader = hr.DataLoader(si.pipeline(si.openimages_like(N, scale=SCALE, seed=5)),
                           batch_size=8, shuffle=True, num_workers=2, collate_fn=ident_collate,
                           persistent_workers=True, options=opts)
    out = []
    for e in range(epochs):
        it = iter(loader)
        if e == 0:  # the storage workers are placed (on the shaped node) before epoch 1
            wait_until(lambda: loader.remote.ready_workers() >= SHAPED_CPUS, timeout_s=120)
            assert set(loader.remote.nodes().values()) == {node.node_id}
        before = node.counters()
        got = {s["i"]: s["x"] for b in it for s in b}
        after = node.counters()
        out.append((got, after[0] - before[0]))
    return out, loader


def test_fewer_bytes_on_the_wire_same_samples(shaped_storage, no_actor_leaks):
    shaping = shaped_storage.qdisc()
    assert "tbf" in shaping and f"{SHAPED_MBIT}Mbit" in shaping, shaping
    raw, plain = epochs_over_link(shaped_storage, "no-off")
    side_raw = plain.remote.near
    plain.close()
    sophon, loader = epochs_over_link(shaped_storage, "headrace")
    side = loader.remote.near
    try:
        for (a, _), (b, _) in zip(raw, sophon, strict=True):
            assert sorted(a) == sorted(b) == list(range(N))
            assert all(torch.equal(a[i], b[i]) for i in a)  # same content wherever it ran
        wire_raw, wire_sophon = raw[1][1], sophon[1][1]
        payload_raw, payload_sophon = side_raw.epochs[1].bytes, side.epochs[1].bytes
        assert side_raw.epochs[1].handed_back == N and side.epochs[1].handed_back == N
        # the wire carries the payload plus Ray's framing: never less, not much more
        for wire, payload in ((wire_raw, payload_raw), (wire_sophon, payload_sophon)):
            assert payload <= wire <= 1.5 * payload + 200_000, (wire, payload)
        plan = side.epochs[1].plan
        assert plan is not None and 0 < plan.offloaded < N
        assert wire_raw / wire_sophon > 1.5, (wire_raw, wire_sophon)
        text = loader.explain()
        assert "near storage (SOPHON)" in text and "% offloaded" in text
    finally:
        loader.close()
