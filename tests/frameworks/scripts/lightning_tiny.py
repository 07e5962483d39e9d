"""The LightningModule and the crash callback of ``lightning_train.py``, apart from it so that
the loader workers ddp_spawn spawns, which import that script, do not import Lightning (the
ranks do: they unpickle these classes, by this module's name)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

CRASH_AT = 3  # the batch (0-based) of epoch 0 after which "crash" saves and stops


class Tiny(L.LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.out = out
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        x, idx = batch
        self.seen.extend(idx.tolist())
        return self.layer(x).pow(2).mean()

    def on_train_epoch_end(self) -> None:
        name = f"rank{self.global_rank}_epoch{self.current_epoch}.json"
        (self.out / name).write_text(json.dumps(self.seen))
        self.seen = []

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Crash(Exception):
    pass


class CrashMidEpoch(L.Callback):
    """Saves a checkpoint after batch ``CRASH_AT`` of epoch 0, records what was trained, stops."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == CRASH_AT:
            trainer.save_checkpoint(self.out / "mid.ckpt")  # on every rank, as Lightning asks
            name = "before_crash.json" if trainer.world_size == 1 else \
                f"before_crash_rank{trainer.global_rank}.json"
            (self.out / name).write_text(json.dumps(pl_module.seen))
            raise Crash
