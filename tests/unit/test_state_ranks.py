"""Whose state a state dict is under DDP (runtime/ranks.py): pure, no process group."""

import pytest

from headrace.errors import StateDictError
from headrace.runtime import ranks


def test_a_state_records_its_rank_and_is_gathered_only_inside_lightnings_checkpoint():
    state = ranks.gathered({"epoch": 3}, (1, 2))
    assert state == {"epoch": 3, "rank": 1, "world": 2}  # no collective outside Lightning
    assert ranks.gathered({"epoch": 3}, None) == {"epoch": 3, "rank": None, "world": None}
    assert not ranks.in_lightning_checkpoint()


def test_each_rank_takes_its_own_entry_of_a_gathered_state():
    gathered = {ranks.GATHERED: [{"rank": 0, "world": 2, "x": "a"}, {"rank": 1, "world": 2, "x": "b"}]}
    assert ranks.own(gathered, (1, 2))["x"] == "b"
    assert ranks.own(gathered, (0, 2))["x"] == "a"
    with pytest.raises(StateDictError, match="states of 2 ranks"):
        ranks.own(gathered, (0, 3))
    with pytest.raises(StateDictError, match="not sharded"):
        ranks.own(gathered, None)


def test_another_ranks_state_is_refused_rather_than_delivering_other_samples():
    with pytest.raises(StateDictError, match="saved by rank 0 of 2.*rank 1 of 2"):
        ranks.own({"rank": 0, "world": 2}, (1, 2))
    assert ranks.own({"rank": 1, "world": 2}, (1, 2)) == {"rank": 1, "world": 2}
    assert ranks.own({"rank": None, "world": None}, (1, 2))  # older or unsharded: as before
    assert ranks.own({"epoch": 0}, (1, 2)) == {"epoch": 0}


def _as_lightning(module: str, name: str, body):
    """A function named ``name`` whose frame reads as Lightning's ``module`` calling ``body``."""
    scope = {"__name__": module, "body": body}
    exec(f"def {name}():\n    return body()", scope)  # noqa: S102 - a frame to stand in
    return scope[name]


def test_only_lightnings_checkpoint_outside_its_exception_handling_gathers():
    asked = _as_lightning("lightning.pytorch.utilities.combined_loader", "_state_dicts",
                          ranks.in_lightning_checkpoint)
    assert asked()  # ModelCheckpoint, save_checkpoint: every rank calls there
    on_exception = _as_lightning("lightning.pytorch.trainer.call", "_interrupt", asked)
    assert not on_exception()  # OnExceptionCheckpoint: perhaps one rank
    elsewhere = _as_lightning("my_script", "_state_dicts", ranks.in_lightning_checkpoint)
    assert not elsewhere()


def test_a_sampler_given_its_rank_without_a_process_group_is_that_rank():
    # DistributedSampler(num_replicas=2, rank=r) in a script without a process group: the
    # states recorded no rank, and rank 0's loaded silently into rank 1's loader
    import torch.utils.data as tud

    data = list(range(8))
    for r in (0, 1):
        sampler = tud.DistributedSampler(data, num_replicas=2, rank=r)
        assert ranks.shard(sampler) == (r, 2)
        assert ranks.shard(tud.BatchSampler(sampler, 2, False)) == (r, 2)
    assert ranks.shard(tud.RandomSampler(data)) is None
    state = ranks.gathered({"epoch": 0}, ranks.shard(tud.DistributedSampler(data, 2, 0)))
    with pytest.raises(StateDictError, match="saved by rank 0 of 2"):
        ranks.own(state, ranks.shard(tud.DistributedSampler(data, 2, 1)))
