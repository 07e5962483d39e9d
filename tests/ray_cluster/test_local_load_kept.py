"""With ``Remote(read_source=False)`` a remote worker's proxy loads the sample in the training
process and ships the loaded value to its actor. A value that would not arrive as it is
(``runtime/faithful.py``: it does not pickle, or two of its parts share memory) is not shipped:
the proxy hands the sample back to the local workers, which load it again and run it whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import headrace as hr
from tests.helpers import ident_collate
from tests.ray_cluster.test_remote import ON_CPU_NODES, wait_ready

pytestmark = pytest.mark.ray

N, WORKERS = 48, 2


class Views:
    """Sample ``i``: an image of ``i`` and its first two rows; even samples hold the rows as a
    view of the image (they share its memory), odd ones as a copy."""

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> dict:
        t = torch.full((8, 8), float(i))
        return {"i": i, "img": t, "top": t[:2] if i % 2 == 0 else t[:2].clone()}


def brighten(d: dict) -> dict:
    d["img"].mul_(2)  # in place: "top" sees it where it is a view of "img"
    return d


def where() -> int:
    """Which worker runs this step: 0 in the local worker process, 1.. in a remote actor
    (``get_worker_info().id``)."""
    return torch.utils.data.get_worker_info().id


def sums(d: dict) -> tuple[int, float, float, int]:
    return d["i"], float(d["img"].sum()), float(d["top"].sum()), where()


class Handles:
    """Sample ``i``: an open file (it does not pickle) for odd ``i``, the file's bytes for even
    ``i``; a step reads it. The file's path is all the source holds (the actors unpickle it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> dict:
        if i % 2 == 0:
            return {"i": i, "data": Path(self.path).read_bytes()}
        return {"i": i, "f": open(self.path, "rb")}  # noqa: SIM115 - read and closed by a step


def read(d: dict) -> tuple[int, bytes, int]:
    if "f" in d:
        with d.pop("f") as f:
            d["data"] = f.read()
    return d["i"], d["data"], where()


def _epoch(pipe: hr.Pipeline, remote: hr.Remote | None,
           stop: int | None = None) -> tuple[list, hr.DataLoader]:
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=5, remote=remote))
    if stop is not None:
        loader.remote.stop = stop  # what apply_offload sets for a remote range [1, stop)
    it = iter(loader)
    try:
        if remote is not None:
            wait_ready(it, WORKERS)
        got = [s for b in it for s in b]
    finally:
        del it
        loader.close()
    return got, loader


def _not_readable_remotely(slow_lane: bool = False) -> hr.Remote:
    return hr.Remote(max_workers=WORKERS, resources=ON_CPU_NODES, read_source=False,
                     slow_lane=slow_lane)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("stop", "slow_lane"), [(None, False), (1, False), (None, True)],
                         ids=["whole", "split_at_load", "slow_lane"])
def test_a_loaded_value_sharing_memory_is_not_shipped(ray_cluster, no_actor_leaks, stop,
                                                      slow_lane):
    # stop=1: nothing runs remotely, the proxy hands the loaded value to the local workers
    # (encoded for worker processes, each leaf on its own) instead of to its actor.
    # slow_lane: remote workers take the slow lane first, where a handed-back sample waits: a
    # proxy took it again, loaded it again and handed it back again (161 hand-backs here)
    pipe = hr.Pipeline(Views(), [hr.step(brighten), hr.step(sums)])
    expected, _ = _epoch(pipe, None)
    got, loader = _epoch(pipe, _not_readable_remotely(slow_lane), stop)
    # shipped, "top" arrived as a copy of its own: mul_ left it as it was (before the fix,
    # the even samples a proxy loaded summed 2 * i * 16, not 4 * i * 16)
    assert sorted(s[:3] for s in got) == sorted(s[:3] for s in expected)
    if stop is None:
        assert any(s[3] >= 1 for s in got if s[0] % 2 == 1), "no sample ran remotely"
    assert all(s[3] == 0 for s in got if s[0] % 2 == 0), "a shared value was shipped"
    # the even samples a proxy loaded, each handed back once
    assert 0 < loader.remote.loaded_again <= N // 2
    assert f"local load: {loader.remote.loaded_again} sample(s)" in loader.explain()


@pytest.mark.timeout(180)
def test_a_loaded_value_that_does_not_pickle_is_not_shipped(ray_cluster, no_actor_leaks,
                                                            tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(256)) * 4)
    pipe = hr.Pipeline(Handles(str(path)), [hr.step(read)])
    got, loader = _epoch(pipe, _not_readable_remotely())
    assert sorted(s[0] for s in got) == list(range(N))  # every sample, once
    assert all(s[1] == path.read_bytes() for s in got)
    assert any(s[2] >= 1 for s in got if s[0] % 2 == 0), "no sample ran remotely"
    assert all(s[2] == 0 for s in got if s[0] % 2 == 1), "a file was shipped"
    assert loader.remote.loaded_again > 0


@pytest.mark.timeout(180)
def test_a_sample_handed_back_unshipped_is_not_counted_as_a_hand_off(ray_cluster,
                                                                     no_actor_leaks):
    # with a timeout no sample reaches, the hand-backs were counted as slow-lane samples and as
    # moves (whose CPU cost explain() then quoted as measured), beside "no hand-off yet"
    pipe = hr.Pipeline(Views(), [hr.step(brighten), hr.step(sums)])
    remote = _not_readable_remotely()
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(seed=5, remote=remote, sample_timeout_s=60.0))
    it = iter(loader)
    try:
        wait_ready(it, WORKERS)
        got = [s for b in it for s in b]
        forwarded = it.scheduler.counters.forwarded
    finally:
        del it
        loader.close()
    assert sorted(s[0] for s in got) == list(range(N))
    assert loader.remote.loaded_again > 0
    assert loader.stats().last.slow_samples == 0 and forwarded == 0
