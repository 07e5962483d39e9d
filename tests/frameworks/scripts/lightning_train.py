"""A tiny Lightning training run over a headrace loader, recording which samples each rank
trained on in each epoch (``<out>/rank<r>_epoch<e>.json``).

Run by tests/frameworks/test_lightning.py in a fresh process:
    python lightning_train.py MODE OUT [N]
MODE: fit (1 process), ddp / ddp_spawn (2 CPU processes, gloo), crash (1 process, saves a
checkpoint mid-epoch then stops as a crash would), resume (a new process resumes from it),
ddp_crash / ddp_resume (the same on 2 CPU processes, strategy="ddp", one epoch; in ddp_crash
rank 1's first sample to start waits at a gate its training process holds closed until it
exits, so rank 1 delivers other positions than rank 0 before the checkpoint).

Lightning is imported in ``main()`` and by ``lightning_tiny.py`` (the module and callback),
not at this script's top: ddp_spawn's spawned loader workers import this script (as
``__mp_main__``) but run no Lightning, and an import of it cost each of them seconds.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import torch
from tests.helpers import wait_at_gate
from torch.utils.data import Dataset

import headrace as hr


class Indexed(Dataset):
    """Sample ``i`` is ``(features, i)``: the index travels with the batch."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((4,), float(i) / self.n), i


class FirstHeldOnRank1(Indexed):
    """On rank 1 (``LOCAL_RANK``, which Lightning sets for the ranks it starts), the first
    sample to start waits at the gate ``gate`` (``tests.helpers.wait_at_gate``) while the
    others go on: rank 1's batches then hold other positions than rank 0's."""

    def __init__(self, n: int, gate: Path) -> None:
        super().__init__(n)
        self.gate = gate

    def __getitem__(self, i: int):
        if os.environ.get("LOCAL_RANK") == "1":
            try:  # the first caller, whichever worker, creates the marker
                os.close(os.open(self.gate.with_suffix(".first"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                wait_at_gate(str(self.gate))
        return super().__getitem__(i)


def main() -> None:
    import lightning as L
    from lightning_tiny import Crash, CrashMidEpoch, Tiny  # beside this script (sys.path[0])

    mode, out = sys.argv[1], Path(sys.argv[2])
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    out.mkdir(parents=True, exist_ok=True)
    L.seed_everything(7, verbose=False)
    if mode == "ddp_spawn":  # workers are spawned too and import this script (not Lightning)
        loader = hr.DataLoader(Indexed(n), batch_size=4, shuffle=True, num_workers=1,
                               persistent_workers=True)
    elif mode in ("ddp_crash", "ddp_resume"):
        gate = out / "rank1.gate"
        if mode == "ddp_crash" and os.environ.get("LOCAL_RANK") == "1":
            held = open(gate, "w")  # noqa: SIM115 - closed (and the gate opened) at exit
            fcntl.flock(held, fcntl.LOCK_EX)
        dataset = FirstHeldOnRank1(n, gate) if mode == "ddp_crash" else Indexed(n)
        loader = hr.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2)
    else:
        loader = hr.DataLoader(Indexed(n), batch_size=4, shuffle=True, num_workers=2)
    common = dict(accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, max_epochs=2)
    if mode in ("ddp", "ddp_spawn"):
        trainer = L.Trainer(devices=2, strategy=mode, **common)
    elif mode in ("ddp_crash", "ddp_resume"):
        callbacks = [CrashMidEpoch(out)] if mode == "ddp_crash" else []
        trainer = L.Trainer(devices=2, strategy="ddp", callbacks=callbacks,
                            **dict(common, max_epochs=1))
    elif mode == "crash":
        trainer = L.Trainer(devices=1, callbacks=[CrashMidEpoch(out)], **common)
    else:
        trainer = L.Trainer(devices=1, **common)
    model = Tiny(out)
    try:
        trainer.fit(model, loader, ckpt_path=out / "mid.ckpt" if mode.endswith("resume") else None)
    except Crash:
        pass
    (out / f"loader_type_rank{trainer.global_rank}.txt").write_text(
        type(trainer.train_dataloader).__module__ + "." + type(trainer.train_dataloader).__name__
        if trainer.train_dataloader is not None else "none")
    if os.environ.get("HEADRACE_TEST_VERBOSE"):
        print(mode, "done", trainer.global_rank)


if __name__ == "__main__":
    main()
