"""What Lightning's fit loop says of a loader state it restores.

Lightning stops asking a loader for batches where its epoch ends for Lightning: ``len(loader)``
batches, or fewer under ``limit_train_batches`` (or a ``CombinedLoader`` in ``"min_size"`` mode,
its shortest loader). A checkpoint written at that last batch holds the loader's state of an
epoch not read to its end, which a state dict resumes (``docs/reliability.md``: a state taken
after leaving the loop describes the epoch that was left). Lightning restores it, goes on with
the next epoch, and calls ``iter(loader)``: the resumed run trained the unseen rest of the cut
epoch's order where an uninterrupted run began the next epoch (whose ``iter()`` drops the cut
one), and every later epoch came one permutation late. The case at ``len(loader)`` batches is
told by the loader itself (``span.covers``); a limit is Lightning's alone, so its fit loop is
asked: its restored ``batch_progress.is_last_batch`` says the checkpoint was written at its
epoch's last batch.
"""

from __future__ import annotations

import sys
from types import FrameType

_FIT_LOOP = ("lightning.pytorch.loops.fit_loop", "pytorch_lightning.loops.fit_loop")


def restored_at_epoch_end() -> bool:
    """Whether Lightning's fit loop is restoring this loader's state (its
    ``_load_combined_loader_states`` is a caller's frame) from a checkpoint written at the last
    batch of its epoch: Lightning then starts the next epoch, and the state's epoch is over."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(64):
        if frame is None:
            return False
        if (frame.f_code.co_name == "_load_combined_loader_states"
                and frame.f_globals.get("__name__", "") in _FIT_LOOP):
            loop = frame.f_locals.get("self")
            progress = getattr(getattr(loop, "epoch_loop", None), "batch_progress", None)
            return getattr(progress, "is_last_batch", False) is True
        frame = frame.f_back
    return False
