"""Lightning 2.6 with a headrace loader: fit, ddp_spawn (DDP: ``test_readme.py``), mid-epoch
checkpoint and resume in a new process, Fabric. Each run is a fresh process
(``scripts/lightning_train.py``) that records which samples each rank trained on."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import headrace as hr
from tests.frameworks.conftest import load_json as load
from tests.frameworks.conftest import run_script
from tests.helpers import IndexDataset

# Lightning is imported by the tests that use it in this process, not at collection: its
# ~200k objects would make the gc.collect() of every leak check before them twice as slow
# (heavy_imports: tests/conftest.py runs these tests last)
pytestmark = [pytest.mark.frameworks, pytest.mark.integration, pytest.mark.heavy_imports,
              pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                 reason="lightning is not installed")]

N = 64


def _seen():
    """A LightningModule that records, per epoch, the samples it trained on (``seen``);
    Lightning is imported here, when a test runs (see ``pytestmark``)."""
    import lightning as L

    class Seen(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen: dict[int, list[int]] = {}

        def training_step(self, batch, batch_idx):
            self.seen.setdefault(self.current_epoch, []).extend(batch.tolist())
            return self.layer(batch.float().unsqueeze(1)).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-4)

    return Seen()


def test_fit_single_process_trains_on_every_sample_each_epoch(tmp_path):
    run_script("lightning_train.py", "fit", str(tmp_path), str(N))
    assert (tmp_path / "loader_type_rank0.txt").read_text() == "headrace.runtime.loader.DataLoader"
    for epoch in (0, 1):
        assert sorted(load(tmp_path / f"rank0_epoch{epoch}.json")) == list(range(N))


def check_ddp_split(out, world=2):
    shares = {}
    for epoch in (0, 1):
        ranks = [load(out / f"rank{r}_epoch{epoch}.json") for r in range(world)]
        for seen in ranks:
            assert len(seen) == len(set(seen)) == N // world  # its share, each sample once
        assert set().union(*ranks) == set(range(N))  # disjoint shares covering the dataset
        shares[epoch] = set(ranks[0])
    assert shares[0] != shares[1]  # DistributedSampler.set_epoch: a new split each epoch


# DDP on 2 CPU processes with strategy="ddp": the README's Lightning snippet, run as written
# (tests/frameworks/test_readme.py), checks the same split on both ranks' headrace loaders.


def test_ddp_spawn_pickles_the_loader_to_its_processes(tmp_path):
    run_script("lightning_train.py", "ddp_spawn", str(tmp_path), str(N), timeout_s=400)
    check_ddp_split(tmp_path)


def test_mid_epoch_checkpoint_resumes_exactly_the_rest_in_a_new_process(tmp_path):
    run_script("lightning_train.py", "crash", str(tmp_path), str(N))
    before = load(tmp_path / "before_crash.json")
    assert len(before) == 4 * 4  # CRASH_AT=3: four batches of 4 trained before the crash
    run_script("lightning_train.py", "resume", str(tmp_path), str(N))
    after = load(tmp_path / "rank0_epoch0.json")  # the rest of epoch 0, after the resume
    assert sorted(before + after) == list(range(N))
    assert len(before) + len(after) == N
    assert sorted(load(tmp_path / "rank0_epoch1.json")) == list(range(N))


def test_ddp_mid_epoch_checkpoint_resumes_each_rank_with_its_own_rest(tmp_path):
    """Lightning writes rank 0's checkpoint only, and every rank loads it: each rank resumed
    from rank 0's delivered positions (its own differ: batches regrouped in the order its
    samples finished; here rank 1's first sample is held back until the crash), trained some
    samples twice and missed others. The loader's state is now every rank's, gathered while
    Lightning asks all ranks for it."""
    run_script("lightning_train.py", "ddp_crash", str(tmp_path), str(N), timeout_s=400)
    run_script("lightning_train.py", "ddp_resume", str(tmp_path), str(N), timeout_s=400)
    shares = []
    for r in (0, 1):
        before = load(tmp_path / f"before_crash_rank{r}.json")
        after = load(tmp_path / f"rank{r}_epoch0.json")  # the rest of epoch 0, resumed
        assert len(before) == 4 * 4 and len(before) + len(after) == N // 2
        assert len(set(before + after)) == N // 2  # each of its samples once
        shares.append(set(before + after))
    assert shares[0] | shares[1] == set(range(N)) and not shares[0] & shares[1]


def test_fabric_setup_dataloaders_keeps_headrace(no_leaks):
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=1)
    loader = hr.DataLoader(IndexDataset(20), batch_size=4, shuffle=True, num_workers=2)
    wrapped = fabric.setup_dataloaders(loader)  # refused the pre-subclass loader
    assert wrapped._dataloader is loader or isinstance(wrapped._dataloader, hr.DataLoader)
    seen = [i for b in wrapped for i in b.tolist()]
    assert sorted(seen) == list(range(20))
    assert all(isinstance(b, torch.Tensor) for b in wrapped)
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_predict_gives_one_prediction_per_sample_in_order(workers, no_leaks):
    # trainer.predict wraps the batch sampler in one whose __iter__ returns itself and starts
    # over: the loader once called iter() on it again after its first batch, which repeated
    # that batch and dropped the last
    import lightning as L

    class Echo(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def predict_step(self, batch, batch_idx):
            return batch

    loader = hr.DataLoader(IndexDataset(10), batch_size=4, num_workers=workers)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    try:
        preds = trainer.predict(Echo(), loader)
    finally:
        loader.close()
    assert [p.tolist() for p in preds] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


class Pids(torch.utils.data.Dataset):
    """Each sample: its index and the pid of the process that loaded it."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        import os

        return torch.tensor([i, os.getpid()])


def test_persistent_workers_last_the_run_and_stop_when_fit_returns(no_leaks):
    # Lightning's teardown resets the loader's torch iterator to None after stopping its
    # workers; headrace's persistent workers (its pool) stop then too, not at process exit
    import lightning as L
    import psutil

    pids: list[set] = []

    class Fit(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def on_train_epoch_start(self):
            pids.append(set())

        def training_step(self, batch, batch_idx):
            pids[-1].update(batch[:, 1].tolist())
            return self.layer(batch[:, :1].float()).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    loader = hr.DataLoader(Pids(), batch_size=4, shuffle=True, num_workers=2,
                           persistent_workers=True)
    trainer = L.Trainer(accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    try:
        trainer.fit(Fit(), loader)
        # the same two workers throughout (new ones each epoch would be 3-6 pids; on a busy
        # machine one worker may deliver nothing in an epoch)
        assert len(pids) == 3 and len(pids[0] | pids[1] | pids[2]) <= 2
        children = {p.pid for p in psutil.Process().children()}  # (other tests' may be there)
        assert pids[0].isdisjoint(children)  # and stopped when fit returned
    finally:
        loader.close()


def test_a_checkpoint_at_an_epochs_last_step_resumes_with_the_next_full_epoch(tmp_path, no_leaks):
    """ModelCheckpoint(every_n_train_steps=len(loader)) writes at the epoch's last batch, where
    Lightning (it knows len(loader)) has not asked for the end: the loader's state then said
    "epoch 0, every sample delivered", and the resumed run trained an empty epoch 1 (0 of its
    steps) where torch's loader gives the next full epoch."""
    import lightning as L

    def trainer(epochs, callbacks=()):
        return L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=list(callbacks), default_root_dir=tmp_path)

    def loader():
        return hr.DataLoader(IndexDataset(40), batch_size=4, shuffle=True, num_workers=2)

    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=10,
                                               save_top_k=-1, filename="{step}")
    first = loader()
    trainer(1, [ckpt]).fit(_seen(), first)  # 10 batches: the checkpoint at the last one
    first.close()
    model, second = _seen(), loader()
    resumed = trainer(2)
    resumed.fit(model, second, ckpt_path=str(tmp_path / "step=10.ckpt"))
    second.close()
    assert sorted(model.seen[1]) == list(range(40)) and 0 not in model.seen
    assert resumed.global_step == 20


def test_a_checkpoint_at_a_limited_epochs_last_step_resumes_with_the_next_epoch(tmp_path, no_leaks):
    """limit_train_batches=5 of 10: the checkpoint at the limited epoch's last batch held a
    state of an epoch not read to its end, and the resumed run trained the unseen rest of that
    epoch's order, where the uninterrupted run began the next permutation (every later epoch
    one permutation late)."""
    import lightning as L

    def fit(epochs, model, ckpt_path=None, callbacks=()):
        # in order: a cut epoch's 5 batches are its first 5 sampler batches, whatever the timing
        loader = hr.DataLoader(IndexDataset(40), batch_size=4, shuffle=True, num_workers=2,
                               generator=torch.Generator().manual_seed(3), in_order=True)
        trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, limit_train_batches=5,
                            logger=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=list(callbacks), default_root_dir=tmp_path)
        trainer.fit(model, loader, ckpt_path=ckpt_path)
        loader.close()
        return trainer

    reference = _seen()
    fit(2, reference)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5,
                                               save_top_k=-1, filename="{step}")
    fit(1, _seen(), callbacks=[ckpt])
    resumed = _seen()
    assert fit(2, resumed, str(tmp_path / "step=5.ckpt")).global_step == 10
    assert len(resumed.seen[1]) == 20 and 0 not in resumed.seen
    assert resumed.seen[1] == reference.seen[1]  # the next permutation's


def _fit_seeded(tmp_path, epochs, model, ckpt_path=None, callbacks=(), reload=0):
    """``trainer.fit`` over 10 batches of 4, in the same order in every run (seeded, in order);
    ``reload``: ``reload_dataloaders_every_n_epochs``."""
    import lightning as L

    loader = hr.DataLoader(IndexDataset(40), batch_size=4, shuffle=True, num_workers=2,
                           generator=torch.Generator().manual_seed(3), in_order=True)
    trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=list(callbacks), default_root_dir=tmp_path,
                        reload_dataloaders_every_n_epochs=reload)
    try:
        trainer.fit(model, loader, ckpt_path=ckpt_path)
    finally:
        loader.close()
    return trainer


def _stepping():
    """A ``_seen`` module whose ``configure_optimizers`` reads
    ``trainer.estimated_stepping_batches`` (Lightning then sets the train loader up first)."""
    model = _seen()

    def configure_optimizers():
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        total = model.trainer.estimated_stepping_batches  # (the 1-epoch run's: 10)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1 / (1 + step / total))
        return [opt], [{"scheduler": sched, "interval": "step"}]

    model.configure_optimizers = configure_optimizers
    return model


def test_mid_epoch_resume_is_exact_when_configure_optimizers_reads_stepping_batches(
        tmp_path, no_leaks):
    """trainer.estimated_stepping_batches in configure_optimizers (the OneCycleLR recipe) makes
    Lightning iterate the loader before it restores the checkpoint, and never load the
    loader's state after (Lightning #20550): the resumed epoch started over, training its
    first 2 batches again (40 samples trained in epoch 0, 32 distinct). headrace loads the
    checkpoint's state at that first iter()."""
    import lightning as L

    stepping = _stepping
    reference = stepping()
    _fit_seeded(tmp_path, 2, reference)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4,
                                               save_top_k=-1, filename="{step}")
    _fit_seeded(tmp_path, 1, stepping(), callbacks=[ckpt])
    resumed = stepping()
    assert _fit_seeded(tmp_path, 2, resumed, str(tmp_path / "step=8.ckpt")).global_step == 20
    assert resumed.seen[0] == reference.seen[0][32:]  # the epoch's last 2 batches, once
    assert resumed.seen[1] == reference.seen[1]


@pytest.mark.parametrize("reload", [0, 1])
def test_a_checkpoint_written_at_epoch_end_resumes_with_the_next_epochs_order(
        reload, tmp_path, no_leaks):
    """ModelCheckpoint's default writes at the epoch's end; Lightning does not restart a
    finished epoch and left the loader's state unloaded, so the resumed epoch 1 replayed epoch
    0's order (torch's loader does the same) where the uninterrupted run drew the next one.
    Lightning keeps that state unloaded for the whole fit: with the loader set up again each
    epoch (reload_dataloaders_every_n_epochs=1) it is loaded at the first epoch only."""
    import lightning as L

    reference = _seen()
    _fit_seeded(tmp_path, 3, reference, reload=reload)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1,
                                               filename="{epoch}")
    _fit_seeded(tmp_path, 1, _seen(), callbacks=[ckpt], reload=reload)
    resumed = _seen()
    trainer = _fit_seeded(tmp_path, 3, resumed, str(tmp_path / "epoch=0.ckpt"), reload=reload)
    assert trainer.global_step == 30 and 0 not in resumed.seen
    assert [resumed.seen[1], resumed.seen[2]] == [reference.seen[1], reference.seen[2]]
    assert reference.seen[1] != reference.seen[0]


def test_a_strategy_restoring_after_setup_warns_that_the_epoch_starts_over(tmp_path, no_leaks):
    """FSDP and DeepSpeed read the checkpoint after setup: where configure_optimizers sets the
    train loader up first (estimated_stepping_batches), its state is read too late to load,
    and the resumed epoch starts over; that went unsaid (torch's loader gets Lightning's "not
    resumable" warning, a loader with a state_dict none)."""
    import lightning as L
    from lightning.pytorch.strategies import SingleDeviceStrategy

    class RestoresAfterSetup(SingleDeviceStrategy):  # as FSDP and DeepSpeed do
        @property
        def restore_checkpoint_after_setup(self):
            return True

    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4,
                                               save_top_k=-1, filename="{step}")
    _fit_seeded(tmp_path, 1, _stepping(), callbacks=[ckpt])
    loader = hr.DataLoader(IndexDataset(40), batch_size=4, shuffle=True)
    trainer = L.Trainer(strategy=RestoresAfterSetup(device=torch.device("cpu")), max_epochs=1,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    try:
        with pytest.warns(UserWarning, match="restores after setup .RestoresAfterSetup"):
            trainer.fit(_stepping(), loader, ckpt_path=str(tmp_path / "step=8.ckpt"))
    finally:
        loader.close()
