"""Lightning 2.6 with a headrace loader over an IterableDataset (torch's own iterator): Lightning
saves the state of every loader that has ``state_dict``, so a checkpoint must not fail on one,
and a run resumed from a mid-epoch checkpoint trains what it does with torch's loader (whose
state Lightning does not save): the interrupted epoch's iterable from its start."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils.data as tud

import headrace as hr

# Lightning is imported by the test, not at collection (see tests/frameworks/test_lightning.py);
# `make test` installs it, so a missing Lightning fails here rather than skipping
pytestmark = [pytest.mark.frameworks, pytest.mark.integration, pytest.mark.heavy_imports]


class Stream(tud.IterableDataset):
    def __iter__(self):
        return iter(range(24))  # 6 batches of 4


def _fit(tmp_path, Loader, epochs, ckpt_path=None, callbacks=()):
    """Samples trained on, per epoch, by a fit of ``epochs`` over ``Loader(Stream())``."""
    import lightning as L

    seen: dict[int, list[int]] = {}

    class Seen(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            seen.setdefault(self.current_epoch, []).extend(batch.tolist())
            return self.layer(batch.float().unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    loader = Loader(Stream(), batch_size=4, num_workers=0)
    trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=list(callbacks), default_root_dir=tmp_path)
    trainer.fit(Seen(), loader, ckpt_path=ckpt_path)
    if isinstance(loader, hr.DataLoader):
        loader.close()
    return seen


def test_a_mid_epoch_checkpoint_and_its_resume_train_as_with_torchs_loader(tmp_path, no_leaks):
    import lightning as L

    def run(Loader, where):
        ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=where, every_n_train_steps=2,
                                                   save_top_k=-1, filename="{step}")
        first = _fit(where, Loader, 1, callbacks=[ckpt])  # checkpoints at steps 2, 4 and 6
        assert sorted(first[0]) == list(range(24))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            resumed = _fit(where, Loader, 2, ckpt_path=str(where / "step=2.ckpt"))
        told = [w for w in caught if issubclass(w.category, hr.IterablePositionWarning)]
        return resumed, len(told)

    # torch's loader: Lightning saved nothing, the interrupted epoch's iterable from its start
    expected, _ = run(tud.DataLoader, tmp_path / "torch")
    assert expected == {0: list(range(24)), 1: list(range(24))}
    assert run(hr.DataLoader, tmp_path / "headrace") == (expected, 1)  # and a warning says so
