"""Pure parts of DDP support: the node's budget per rank, which samplers shard, the warning for
an unsharded loader, and padding an epoch to the batch count every rank takes."""

from __future__ import annotations

import warnings

import pytest
import torch.utils.data as tud

from headrace.planner import ranks
from headrace.runtime import distributed

DS = list(range(10))


def never() -> int | None:
    raise AssertionError("torch.distributed asked where the environment answers")


def test_local_world_size_reads_torchrun_env():
    none = lambda: None  # noqa: E731 - torch.distributed not initialised
    assert ranks.local_world_size({}, none) == 1
    assert ranks.local_world_size({"LOCAL_WORLD_SIZE": "4"}, never) == 4
    assert ranks.local_world_size({"LOCAL_WORLD_SIZE": "junk"}, none) == 1
    assert ranks.local_world_size({"LOCAL_WORLD_SIZE": "0"}, none) == 1


def test_local_world_size_reads_mpi_launchers():
    assert ranks.local_world_size({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, never) == 8
    assert ranks.local_world_size({"MPI_LOCALNRANKS": "2"}, never) == 2
    assert ranks.local_world_size({"MV2_COMM_WORLD_LOCAL_SIZE": "3"}, never) == 3
    # torchrun's own wins over an MPI launcher's around it
    assert ranks.local_world_size({"LOCAL_WORLD_SIZE": "4",
                                   "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, never) == 4


def test_local_world_size_reads_this_nodes_tasks_of_a_slurm_step():
    step = {"SLURM_STEP_TASKS_PER_NODE": "4(x2),2,1(x3)"}
    assert [ranks.local_world_size({**step, "SLURM_NODEID": str(k)}, never)
            for k in range(6)] == [4, 4, 2, 1, 1, 1]
    # the step's node index wins over the job's
    assert ranks.local_world_size({**step, "SLURM_NODEID": "0", "SLURM_STEP_NODEID": "2"},
                                  never) == 2
    none = lambda: None  # noqa: E731
    # outside a step (a batch script's one process), or unreadable: not read
    assert ranks.local_world_size({"SLURM_NTASKS_PER_NODE": "4", "SLURM_NODEID": "0"}, none) == 1
    assert ranks.local_world_size({**step, "SLURM_NODEID": "9"}, none) == 1
    assert ranks.local_world_size({"SLURM_STEP_TASKS_PER_NODE": "4(y2)",
                                   "SLURM_NODEID": "0"}, none) == 1


def test_ranks_meeting_at_a_loopback_address_are_all_on_this_node():
    # Lightning's ddp launcher: MASTER_ADDR 127.0.0.1 and WORLD_SIZE, no local size
    assert ranks.local_world_size({"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "4"}, never) == 4
    # ddp_spawn, mp.spawn: no WORLD_SIZE variable; torch.distributed's group knows it
    for addr in ("localhost", "::1", "[::1]", "127.0.1.1"):
        assert ranks.local_world_size({"MASTER_ADDR": addr}, lambda: 3) == 3
    assert ranks.local_world_size({"MASTER_ADDR": "localhost"}, lambda: None) == 1
    # another host's address: the ranks may be anywhere
    for addr in ("10.0.0.7", "node-0", ""):
        assert ranks.local_world_size({"MASTER_ADDR": addr, "WORLD_SIZE": "16"}, never) == 1


def test_cores_and_memory_are_shared_by_the_ranks_of_a_node():
    assert ranks.cpu_share(16, 4) == 4
    assert ranks.cpu_share(2, 4) == 1  # never zero
    assert ranks.memory_share(8e9, 4) == 2e9


def test_rank_cpus_follows_local_world_size(monkeypatch):
    from headrace.planner import workers

    monkeypatch.setattr(workers, "available_cpus", lambda: 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert workers.rank_cpus() == 4
    assert workers.AutoscaleConfig().start_count() == 4
    assert workers.AutoscaleConfig().bounds() == (1, 8)  # 2 x this rank's cores


def test_sharded_samplers_are_recognised():
    dsamp = tud.DistributedSampler(DS, num_replicas=2, rank=0)
    assert distributed.is_sharded(dsamp)
    assert distributed.is_sharded(tud.BatchSampler(dsamp, 2, False))
    assert not distributed.is_sharded(tud.RandomSampler(DS))
    assert not distributed.is_sharded(tud.BatchSampler(tud.SequentialSampler(DS), 2, False))

    class Shard(tud.BatchSampler):  # Accelerate's BatchSamplerShard says num_processes
        num_processes = 2

    assert distributed.is_sharded(Shard(tud.SequentialSampler(DS), 2, False))


def test_warning_only_for_default_samplers_on_several_ranks():
    seq = tud.BatchSampler(tud.SequentialSampler(DS), 2, False)
    assert distributed.unsharded_warning(seq, None) is None  # not distributed
    msg = distributed.unsharded_warning(seq, (1, 4))
    assert msg is not None and "rank 1" in msg and "DistributedSampler" in msg
    custom = tud.BatchSampler(tud.SubsetRandomSampler([1, 2]), 2, False)
    assert distributed.unsharded_warning(custom, (0, 2)) is None  # the user's choice
    shard = tud.BatchSampler(tud.DistributedSampler(DS, num_replicas=2, rank=0), 2, False)
    assert distributed.unsharded_warning(shard, (0, 2)) is None


def test_even_batches_only_where_ranks_must_agree_and_samples_can_vanish():
    shard = tud.DistributedSampler(DS, num_replicas=2, rank=0)
    assert distributed.needs_even_batches(shard, "skip")
    assert not distributed.needs_even_batches(shard, "raise")
    assert not distributed.needs_even_batches(tud.RandomSampler(DS), "skip")


class Inner:
    def __init__(self, batches):
        self._it = iter(batches)
        self.origin = "kept"

    def __next__(self):
        return next(self._it)


def test_even_batches_repeat_the_last_batch_up_to_the_count_and_delegate():
    it = distributed.EvenBatches(Inner([[1, 2], [3]]), expected=4)
    assert len(it) == 4 and it.origin == "kept"
    with pytest.warns(UserWarning, match="2 batch"):
        got = list(it)
    assert got == [[1, 2], [3], [3], [3]] and it.repeated == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(distributed.EvenBatches(Inner([[1], [2]]), expected=2)) == [[1], [2]]
    assert list(distributed.EvenBatches(Inner([]), expected=3)) == []  # nothing to repeat
