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

Where Lightning does not load a checkpoint's loader state at all (:func:`unloaded_state`), the
fit's first ``iter(loader)`` loads it.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from types import FrameType
from typing import Any

_FIT_LOOP = ("lightning.pytorch.loops.fit_loop", "pytorch_lightning.loops.fit_loop")
_TRAINER = ("lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")


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


_APPLIED: weakref.WeakKeyDictionary[Any, tuple[list[Any], set[int]]] = weakref.WeakKeyDictionary()
"""Per fit loop: the list of loader states of its checkpoint that :func:`unloaded_state` handed
out, and the positions (among its stateful loaders) already handed out from it."""


def unloaded_state(loader: Any) -> tuple[dict[str, Any], bool] | None:
    """The state a Lightning checkpoint holds for ``loader`` that Lightning will not load, and
    whether Lightning ended that state's epoch; None where there is none (or no Lightning).

    Asked at ``iter(loader)`` by the fit loop's ``setup_data`` (the epoch's first ``iter()``;
    later epochs' come from the epoch loop). Two cases, in each of which torch's stateful
    loaders are not restored either:

    - ``trainer.estimated_stepping_batches`` read in ``configure_optimizers`` (the OneCycleLR
      recipe) runs ``setup_data`` before the checkpoint is restored, and the second call
      returns early (Lightning #20550): the state was never loaded, the resumed epoch started
      over, repeating the batches trained before the checkpoint and skipping as many. The
      checkpoint is already read then (``_loaded_checkpoint``; strategies that restore after
      setup, ``restore_checkpoint_after_setup``: FSDP, DeepSpeed, read it later, and a
      ``UserWarning`` says the resumed epoch starts over), so its state is handed out here.
    - a checkpoint written once the epoch was over (``ModelCheckpoint``'s default, at the
      epoch's end): Lightning does not restart a finished epoch and keeps the states unloaded
      (``_combined_loader_states_to_load``), so the next epoch replayed epoch 0's order. The
      state (between epochs) gives the order the uninterrupted run's next epoch had.

    Each state is handed out once per fit loop and loader position, as Lightning loads it
    once (a loader rebuilt by ``reload_dataloaders_every_n_epochs`` gets nothing)."""
    if not any(name in sys.modules for name in _FIT_LOOP):
        return None
    loop = _fit_loop_setting_up(sys._getframe(1))
    if loop is None:
        return None
    pending = getattr(loop, "_combined_loader_states_to_load", None)
    if pending:  # restored, not loaded: Lightning does not restart that (finished) epoch
        states, ended = pending, True
    else:
        connector = getattr(getattr(loop, "trainer", None), "_checkpoint_connector", None)
        ckpt = getattr(connector, "_loaded_checkpoint", None) or {}
        fit = ckpt.get("loops", {}).get("fit_loop", {})
        states = fit.get("state_dict", {}).get("combined_loader")
        if not states:
            _warn_if_restored_later(loop)
            return None
        # what Lightning's restore will decide: a finished epoch is not restarted (unless
        # max_steps is set), else the state is its epoch's, over if at its last batch
        current = fit.get("epoch_progress", {}).get("current", {})
        finished = current.get("ready") == current.get("started") == current.get("processed")
        ended = (finished and getattr(loop.trainer, "max_steps", -1) == -1) or \
            fit.get("epoch_loop.batch_progress", {}).get("is_last_batch") is True
    stateful = [dl for dl in getattr(getattr(loop, "_combined_loader", None), "flattened", ())
                if callable(getattr(dl, "state_dict", None))
                and callable(getattr(dl, "load_state_dict", None))]
    where = [i for i, dl in enumerate(stateful) if dl is loader]
    if len(stateful) != len(states) or len(where) != 1:  # Lightning would raise, or not ours
        return None
    applied = _APPLIED.get(loop)
    if applied is None or applied[0] is not states:
        applied = (states, set())
        _APPLIED[loop] = applied
    if where[0] in applied[1]:
        return None
    applied[1].add(where[0])
    return states[where[0]], ended


_RESTORED_LATER = (
    "Lightning iterates this headrace loader before it restores the checkpoint {path!r} "
    "(configure_optimizers read trainer.estimated_stepping_batches, or the like) and will not "
    "load the loader's state after (Lightning #20550); with a strategy that restores after "
    "setup ({strategy}) the state cannot be read in time: a mid-epoch checkpoint's epoch starts "
    "over (its trained batches come again and as many are never trained). Count the steps "
    "without setting up the train loader (e.g. len(dataset) // batch_size * max_epochs), or "
    "checkpoint at epoch ends.")


def _warn_if_restored_later(loop: Any) -> None:
    """Warn where the fit loop sets the loader up before the restore of a checkpoint that its
    strategy reads only after setup (``unloaded_state`` cannot hand its state out)."""
    strategy = getattr(getattr(loop, "trainer", None), "strategy", None)
    if not getattr(strategy, "restore_checkpoint_after_setup", False):
        return
    frame: FrameType | None = sys._getframe(1)
    for _ in range(96):
        if frame is None:
            return
        if frame.f_globals.get("__name__", "") in _TRAINER:
            if frame.f_code.co_name == "_run_stage":
                return  # restored already
            if frame.f_code.co_name == "_run" and frame.f_locals.get("ckpt_path"):
                warnings.warn(_RESTORED_LATER.format(
                    path=str(frame.f_locals["ckpt_path"]),
                    strategy=type(strategy).__name__), UserWarning, stacklevel=2)
                return
        frame = frame.f_back


def _fit_loop_setting_up(frame: FrameType | None) -> Any:
    """Lightning's fit loop whose ``setup_data`` is among the callers from ``frame``, or None."""
    for _ in range(64):
        if frame is None:
            return None
        if (frame.f_code.co_name == "setup_data"
                and frame.f_globals.get("__name__", "") in _FIT_LOOP):
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None
