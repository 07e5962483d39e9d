"""Resuming a loader over an IterableDataset (torch's own iterator, ``runtime/iterable_dataset.py``)
gives its workers the seeds the uninterrupted run's would have had (``get_worker_info().seed``),
so a dataset that shuffles or augments with them goes on as it would have.

The state dict is taken from one loader and loaded, through JSON, into a fresh one (its worker
processes are new ones, as in a resumed process). The seeds come from ``Options(seed=)``,
``generator=`` or torch's global generator (which a training script restores itself, as it
does for its model); with persistent workers too, whose seed torch draws once."""

from __future__ import annotations

import json

import pytest
import torch
import torch.utils.data as tud

import headrace as hr

pytestmark = pytest.mark.integration

N = 12


class Shuffled(tud.IterableDataset):
    """Each worker shuffles its shard with its worker seed, as a shuffle buffer would."""

    def __iter__(self):
        info = tud.get_worker_info()
        ids = list(range(info.id, N, info.num_workers))
        g = torch.Generator().manual_seed(info.seed)
        return iter([ids[p] for p in torch.randperm(len(ids), generator=g).tolist()])


def make(rng: str, persistent: bool) -> hr.DataLoader:
    kw: dict = {"options": hr.Options(seed=3)} if rng == "seed" else \
        {"generator": torch.Generator().manual_seed(3)} if rng == "generator" else {}
    return hr.DataLoader(Shuffled(), batch_size=3, num_workers=2, persistent_workers=persistent,
                         multiprocessing_context="fork", **kw)


def epoch(it) -> list[list[int]]:
    return [b.tolist() for b in it]


def uninterrupted(rng: str, persistent: bool, epochs: int) -> list[list[list[int]]]:
    torch.manual_seed(11)
    loader = make(rng, persistent)
    out = [epoch(loader) for _ in range(epochs)]
    loader.close()
    if not persistent:  # the check below can tell epochs apart
        assert out[0] != out[1]
    return out


def resumed(rng: str, persistent: bool, saved: dict, global_rng: torch.Tensor) -> hr.DataLoader:
    loader = make(rng, persistent)
    torch.set_rng_state(global_rng)  # the training script restores torch's global generator
    loader.load_state_dict(json.loads(json.dumps(saved)))
    return loader


CASES = [(rng, persistent) for rng in ("seed", "generator", "global") for persistent in (False, True)]


@pytest.mark.parametrize("rng, persistent", CASES)
def test_resumed_between_epochs_the_next_epochs_get_the_uninterrupted_runs_seeds(
        rng, persistent, no_leaks):
    full = uninterrupted(rng, persistent, 3)
    torch.manual_seed(11)
    loader = make(rng, persistent)
    assert epoch(loader) == full[0]
    saved, global_rng = loader.state_dict(), torch.get_rng_state()
    loader.close()
    assert saved["epochs_started"] == 1 and saved["batches_delivered"] == 0
    again = resumed(rng, persistent, saved, global_rng)
    # epoch 0's seeds came again here (the state held no generator): the same shuffle
    assert [epoch(again), epoch(again)] == full[1:]
    again.close()


@pytest.mark.parametrize("rng, persistent", CASES)
def test_an_epoch_resumed_part_way_starts_over_with_its_own_seeds(rng, persistent, no_leaks):
    full = uninterrupted(rng, persistent, 3)
    torch.manual_seed(11)
    loader = make(rng, persistent)
    assert epoch(loader) == full[0]
    it = iter(loader)
    assert next(it).tolist() == full[1][0]
    saved, global_rng = loader.state_dict(), torch.get_rng_state()
    loader.close()
    assert saved["epochs_started"] == 2 and saved["batches_delivered"] == 1
    with pytest.warns(hr.IterablePositionWarning, match="starts that epoch over"):
        again = resumed(rng, persistent, saved, global_rng)
    # (a new base seed was drawn here: from a fresh generator, epoch 0's; from the restored
    # global one, the next epoch's) the cut epoch whole, as it began, then the one after
    assert [epoch(again), epoch(again)] == full[1:]
    again.close()


def test_a_loaded_state_replaces_running_persistent_workers_and_their_seed(no_leaks):
    full = uninterrupted("seed", True, 1)
    fresh = make("seed", True).state_dict()  # a state from before any epoch: seed 3
    other = hr.DataLoader(Shuffled(), batch_size=3, num_workers=2, persistent_workers=True,
                          multiprocessing_context="fork", options=hr.Options(seed=4))
    assert epoch(other) != full[0]  # its workers have seed 4's base seed
    other.load_state_dict(fresh)
    assert epoch(other) == full[0]
    other.close()
