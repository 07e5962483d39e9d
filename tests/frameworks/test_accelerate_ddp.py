"""Accelerate on 2 CPU processes (torchrun, gloo) with headrace: each rank gets its share
(disjoint, covering the dataset, a new split each epoch), gradient accumulation syncs at the
same batches as with torch's loader prepared by Accelerate, and ``save_state`` mid-epoch then
``load_state`` in new processes delivers exactly the rest on every rank: in a second epoch, of a
shuffled loader without a seed of its own (the DistributedSampler's seed, drawn at prepare(),
and the epoch Accelerate gives it, both come back with the state; 48-50 of 64 distinct
samples resumed before)."""

from __future__ import annotations

import sys

import pytest

from tests.frameworks.conftest import load_json, run_script

pytest.importorskip("accelerate")

pytestmark = [pytest.mark.frameworks, pytest.mark.integration]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
N = 44


def test_two_processes_shard_sync_and_resume(tmp_path):
    run_script("accelerate_ranks.py", str(tmp_path), "train", launcher=TORCHRUN, timeout_s=400)
    ranks = [load_json(tmp_path / f"train_rank{r}.json") for r in (0, 1)]
    for r in ranks:
        assert r["world"] == 2 and r["type"] == "DataLoader"
        assert r["syncs"] == r["torch_syncs"]  # same batches per epoch, end_of_dataloader at the end
        assert r["syncs"][5] and r["syncs"][11]  # 6 batches per epoch: the last one syncs
    for epoch in (0, 1):
        shares = [r["seen"][epoch] for r in ranks]
        assert all(len(s) == len(set(s)) == N // 2 for s in shares)
        assert set(shares[0]) | set(shares[1]) == set(range(N))
    assert set(ranks[0]["seen"][0]) != set(ranks[0]["seen"][1])  # set_epoch: a new split
    run_script("accelerate_ranks.py", str(tmp_path), "resume", launcher=TORCHRUN, timeout_s=400)
    everything = []
    for r in (0, 1):
        before = ranks[r]["before"]
        after = load_json(tmp_path / f"resume_rank{r}.json")["after"]
        assert len(before) == 8 and len(before) + len(after) == N // 2
        assert not set(before) & set(after)
        assert set(before + after) != set(ranks[r]["epoch0"])  # epoch 1's share, not epoch 0's
        everything += before + after
    assert sorted(everything) == list(range(N))  # each rank resumed its own share exactly


def test_gather_for_metrics_on_three_ranks_gives_the_dataset_as_torchs_loader(tmp_path):
    """An evaluation loader was sharded with a DistributedSampler (indices interleaved, the
    tail padded by wrapping), and gather_for_metrics, which trims the padding off the end of
    the last gathered step, kept a duplicate and dropped a sample on 3 ranks and more (15 of
    75 lengths and batch sizes tried); it also trimmed with one sample a rank per step where
    the loader was built over Accelerate's BatchSamplerShard. A shuffled loader's padding
    was regrouped into any batch likewise."""
    launcher = [*TORCHRUN[:-1], "--nproc_per_node=3"]
    run_script("accelerate_ranks.py", str(tmp_path), "gather", launcher=launcher, timeout_s=400)
    outs = [load_json(tmp_path / f"gather_rank{r}.json") for r in range(3)]
    # even_batches=False (it was ignored: every rank padded to the same count): each rank's
    # batches are those of torch's loader prepared alike, and shuffled shares do not overlap
    for k, (n, *_) in enumerate(outs[0]["uneven"]):
        shuffled: list[int] = []
        for out in outs:
            _, torch_batches, headrace_batches, shuffled_batches = out["uneven"][k]
            assert headrace_batches == torch_batches, n
            shuffled += [i for b in shuffled_batches for i in b]
        assert sorted(shuffled) == list(range(n))  # each sample once, none padded
    for r in range(3):
        for n, torch_got, headrace_got, shuffled in outs[r]["gathered"]:
            assert torch_got == list(range(n))
            assert headrace_got == torch_got
            # shuffled: the ranks' padded duplicate was regrouped into any batch, and the
            # trim of the last step dropped a real sample instead (one twice, one never)
            assert sorted(shuffled) == list(range(n))


def test_gather_for_metrics_with_drop_last_gathers_what_torchs_loader_does(tmp_path):
    """The rebuilt loader over Accelerate's BatchSamplerShard reads drop_last=False, and
    Accelerate trimmed the last gathered step to len(dataset) % (batch_size * ranks) samples
    although every step was full: 2 of 8, 37 of 40, 14 of 18 samples gathered."""
    run_script("accelerate_ranks.py", str(tmp_path), "droplast", launcher=TORCHRUN, timeout_s=400)
    for r in (0, 1):
        for n, bs, shuffle, torch_got, headrace_got in load_json(
                tmp_path / f"droplast_rank{r}.json")["gathered"]:
            full = n // (bs * 2) * bs * 2  # whole global steps only
            assert len(torch_got) == full, (n, bs)
            assert len(headrace_got) == len(set(headrace_got)) == full, (n, bs, shuffle)
            assert set(headrace_got) <= set(range(n))
            if not shuffle:
                assert headrace_got == torch_got, (n, bs)


def test_random_samplers_give_each_sample_once_an_epoch_over_ranks_seeded_apart(tmp_path):
    """A random sampler other than shuffle=True was sharded over each rank's own draw: with the
    ranks' global generators seeded apart (per-rank augmentation), 28-30 distinct samples of 40
    an epoch. Its generator is now synchronised from rank 0 at each iter(), as Accelerate does
    for torch's loaders, and a mid-epoch save_state / load_state (in processes seeded
    otherwise) still replays the saved epoch and the next exactly."""
    run_script("accelerate_ranks.py", str(tmp_path), "samplers", launcher=TORCHRUN,
               timeout_s=400)
    ranks = [load_json(tmp_path / f"samplers_rank{r}.json") for r in (0, 1)]
    for name in ("subset", "weighted", "batch_sampler"):
        for epoch in (0, 1):
            shares = [r["epochs"][name][epoch] for r in ranks]
            assert sorted(shares[0] + shares[1]) == list(range(40)), (name, epoch)
        assert ranks[0]["epochs"][name][0] != ranks[0]["epochs"][name][1]  # a new order
    assert sorted(ranks[0]["epoch0"] + ranks[1]["epoch0"]) == list(range(40))
    run_script("accelerate_ranks.py", str(tmp_path), "samplers_resume", launcher=TORCHRUN,
               timeout_s=400)
    epoch1, epoch2 = [], []
    for r in (0, 1):
        resumed = load_json(tmp_path / f"samplers_resume_rank{r}.json")
        assert len(ranks[r]["before"]) == 8
        assert resumed["rest"] == ranks[r]["rest"] and resumed["next"] == ranks[r]["next"]
        epoch1 += ranks[r]["before"] + resumed["rest"]
        epoch2 += resumed["next"]
    assert sorted(epoch1) == sorted(epoch2) == list(range(40))
