"""Whose state a state dict is, when each rank of a DDP job loads its own share.

A loader sharded by a ``DistributedSampler`` delivers its rank's samples out of order: which
positions a rank has delivered is its own, and no rank's bitmap describes another's. Lightning
asks every rank for the loader's ``state_dict()`` when it writes a checkpoint (its
``save_checkpoint`` runs on all processes), then writes rank 0's file only, and every rank
loads that file: rank 1 resumed from rank 0's positions, trained some samples twice and never
saw others, without a word. So:

* inside Lightning's checkpoint (its ``_CombinedLoader._state_dicts`` is on the stack, where
  every rank calls ``state_dict()`` at once), the state is every rank's, gathered:
  ``{"headrace_ranks": [state of rank 0, state of rank 1, ...]}`` (as Accelerate's
  ``save_state`` keeps it, ``integrations/accelerate.py``). Outside of it nothing is gathered:
  a script that saves on rank 0 only (``if rank == 0: torch.save(loader.state_dict())``) would
  wait for ever in a collective the other ranks never join;
* every state records the rank and world size of the loader that wrote it (``None`` when not
  sharded), and a loader refuses another rank's (``StateDictError``) rather than deliver other
  samples;
* ``load_state_dict`` of a gathered state takes this rank's entry.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import torch

from headrace.errors import StateDictError
from headrace.runtime import distributed, settled_gather

GATHERED = "headrace_ranks"
"""The key of a state dict holding every rank's state, in rank order."""

_LIGHTNING = ("lightning.pytorch.utilities.combined_loader",
              "pytorch_lightning.utilities.combined_loader")
_LIGHTNING_CALL = ("lightning.pytorch.trainer.call", "pytorch_lightning.trainer.call")


def shard(sampler: Any) -> tuple[int, int] | None:
    """``(rank, world size)`` of a loader whose ``sampler`` (or batch sampler) gives each rank
    its own share (``distributed.is_sharded``): the process group's of several ranks, else the
    rank and replicas the sampler was given itself (``DistributedSampler(num_replicas=2,
    rank=1)`` without a process group, whose states were taken for any rank's); else
    ``None``."""
    if not distributed.is_sharded(sampler):
        return None
    return distributed.world() or distributed.sampler_rank(sampler)


def in_lightning_checkpoint() -> bool:
    """Whether Lightning's checkpoint is asking (its ``_state_dicts`` is a caller's frame),
    every rank at once: not while Lightning handles an exception (``_interrupt``, where
    ``OnExceptionCheckpoint`` saves on the ranks the exception reached, perhaps one), where a
    gather would wait for ranks that never come instead of writing the checkpoint."""
    frame: FrameType | None = sys._getframe(1)
    asked = False
    for _ in range(64):
        if frame is None:
            break
        module = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "_state_dicts" and module in _LIGHTNING:
            asked = True
        elif frame.f_code.co_name == "_interrupt" and module in _LIGHTNING_CALL:
            return False
        frame = frame.f_back
    return asked


def gathered(state: dict[str, Any], where: tuple[int, int] | None) -> dict[str, Any]:
    """``state`` marked with its rank; every rank's, gathered, inside Lightning's checkpoint
    on a sharded loader of an initialised process group of that world size."""
    state = dict(state, rank=where[0] if where else None, world=where[1] if where else None)
    if where is None or distributed.world() is None or not in_lightning_checkpoint():
        return state  # (a gather needs the process group)
    return gather_all(state, where[1])


def gather_all(state: Any, world: int) -> dict[str, Any]:
    """Every rank's ``state``, in rank order, under :data:`GATHERED` (a collective: every
    rank of the process group calls it; also Accelerate's ``save_state``). With gloo, once no
    thread of the process group holds the gather's tensors (``runtime/settled_gather.py``: a
    script ending right after a checkpoint aborted at exit)."""
    if torch.distributed.get_backend() == "gloo":
        return {GATHERED: settled_gather.all_gather_settled(state, world)}
    states: list[Any] = [None] * world
    torch.distributed.all_gather_object(states, state)
    return {GATHERED: states}


def own(state: Any, where: tuple[int, int] | None) -> Any:
    """This rank's entry of a gathered state; a plain one checked to be this rank's."""
    if isinstance(state, dict) and GATHERED in state:
        ranks = state[GATHERED]
        if where is None or len(ranks) != where[1]:
            raise StateDictError(
                f"the state dict holds the states of {len(ranks)} ranks, and this loader is "
                + (f"rank {where[0]} of {where[1]}" if where else "not sharded by a "
                   "DistributedSampler") + ": resume with the world size that saved it")
        state = ranks[where[0]]
    if isinstance(state, dict) and where is not None and state.get("world") is not None \
            and (state.get("rank"), state.get("world")) != where:
        raise StateDictError(
            f"the state dict was saved by rank {state['rank']} of {state['world']}, and this "
            f"loader is rank {where[0]} of {where[1]}: each rank delivers its own samples out of "
            "order, so another rank's state would deliver other samples. Save every rank's "
            "state_dict() and give each rank its own")
    return state
