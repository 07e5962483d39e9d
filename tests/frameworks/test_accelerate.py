"""Accelerate 1.15 with a headrace loader, in one process: the prepared loader keeps headrace,
gradient accumulation syncs at the same batches as with torch's loader (``end_of_dataloader``),
``save_state`` / ``load_state`` resume exactly, ``skip_first_batches`` never drops headrace
silently, and a bare ``accelerator.prepare(headrace_loader)`` raises. Two processes:
test_accelerate_ddp.py."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from tests.helpers import IndexDataset

accelerate = pytest.importorskip("accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.utils import set_seed  # noqa: E402

from headrace.integrations import accelerate as hr_accel  # noqa: E402

pytestmark = [pytest.mark.frameworks, pytest.mark.integration,
              pytest.mark.heavy_imports]  # an Accelerator imports torch._dynamo and sympy


def sync_pattern(accelerator, model, loader, epochs=2):
    """``sync_gradients`` after each batch of ``epochs`` epochs, and the indices seen."""
    syncs, seen = [], []
    for _ in range(epochs):
        for batch in loader:
            with accelerator.accumulate(model):
                seen.extend(batch.tolist())
                syncs.append(accelerator.sync_gradients)
    return syncs, seen


def test_prepared_loader_is_headrace_and_syncs_where_torch_does(no_leaks):
    set_seed(0)
    acc = Accelerator(gradient_accumulation_steps=3, cpu=True)
    model = torch.nn.Linear(1, 1)
    torch_loader = acc.prepare(tud.DataLoader(IndexDataset(40), batch_size=4, shuffle=True))
    want, _ = sync_pattern(acc, model, torch_loader)
    loader = hr.DataLoader(IndexDataset(40), batch_size=4, shuffle=True, num_workers=2)
    model2, prepared = hr_accel.prepare(acc, torch.nn.Linear(1, 1), loader)
    assert prepared.base_dataloader is loader  # one process: nothing to shard
    assert prepared in acc._dataloaders  # registered: save_state and gather_for_metrics see it
    assert prepared.device == acc.device  # batches are moved there by Accelerate's shard code
    got, seen = sync_pattern(acc, model2, prepared)
    assert got == want  # 10 batches, 3 per step: syncs at 3, 6, 9 and the epoch's last batch
    assert want[9] and want[19]  # end_of_dataloader was signalled at each epoch's last batch
    assert sorted(seen[:40]) == sorted(seen[40:]) == list(range(40))
    loader.close()


def test_a_bare_prepare_raises_naming_the_helper():
    acc = Accelerator(cpu=True)
    loader = hr.DataLoader(IndexDataset(8), batch_size=4)
    with pytest.raises(hr.HeadraceError, match="headrace.integrations.accelerate"):
        acc.prepare(loader)


def test_use_seedable_sampler_is_refused_without_a_seed_of_the_loaders_own():
    """It was silently ignored: the shuffle order moved with other draws from torch's global
    generator, what the setting exists to prevent."""
    from accelerate.utils import DataLoaderConfiguration

    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    with pytest.raises(hr.HeadraceError, match="use_seedable_sampler"):
        hr_accel.prepare_data_loader(acc, hr.DataLoader(IndexDataset(8), batch_size=4, shuffle=True))
    orders = []
    for _ in range(2):  # with a seed of its own, other global draws do not move the order
        torch.rand(3)
        seeded = hr.DataLoader(IndexDataset(8), batch_size=4, shuffle=True,
                               options=hr.Options(seed=3))
        orders.append([i for b in hr_accel.prepare_data_loader(acc, seeded) for i in b.tolist()])
        seeded.close()
    assert orders[0] == orders[1] and sorted(orders[0]) == list(range(8))
    ordered = hr.DataLoader(IndexDataset(8), batch_size=4)  # nothing to seed: accepted
    assert [i for b in hr_accel.prepare_data_loader(acc, ordered) for i in b.tolist()] == list(range(8))


def saved_then_restored(tmp_path, make_loader):
    """Three batches of a prepared loader, ``save_state``, then a fresh accelerator and loader
    (as after a crash) with ``load_state``: (the indices before, the restored prepared loader,
    its headrace loader)."""
    acc = Accelerator(cpu=True)
    loader = make_loader()
    it = iter(hr_accel.prepare_data_loader(acc, loader))
    before = [i for _ in range(3) for i in next(it).tolist()]
    acc.save_state(tmp_path / "ckpt")
    del it
    loader.close()
    acc2 = Accelerator(cpu=True)
    loader2 = make_loader()
    prepared2 = hr_accel.prepare_data_loader(acc2, loader2)
    acc2.load_state(tmp_path / "ckpt")
    return before, prepared2, loader2


def test_save_state_and_load_state_resume_exactly(tmp_path, no_leaks):
    set_seed(1)
    before, prepared, loader = saved_then_restored(tmp_path, lambda: hr.DataLoader(
        IndexDataset(32), batch_size=4, shuffle=True, num_workers=2, options=hr.Options(seed=9)))
    after = [i for b in prepared for i in b.tolist()]
    assert len(before) == 12 and sorted(before + after) == list(range(32))
    loader.close()


def test_the_load_state_then_skip_first_batches_pattern_skips_once(tmp_path, no_leaks):
    # Accelerate's examples resume with load_state(), then skip_first_batches(loader, step):
    # headrace's load_state already resumes after the saved batches; they are not skipped twice
    before, prepared, loader = saved_then_restored(
        tmp_path, lambda: hr.DataLoader(IndexDataset(32), batch_size=4, num_workers=2))
    after = [i for b in hr_accel.skip_first_batches(prepared, 3) for i in b.tolist()]
    assert before == list(range(12)) and after == list(range(12, 32))  # as with torch's loader
    loader.close()


def _epoch_end_loader(sampler_kind):
    dataset = IndexDataset(40)
    if sampler_kind == "distributed":  # the user's, sharded already: set_epoch(iteration) decides
        sampler = tud.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=5)
        return hr.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2, in_order=True)
    return hr.DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, in_order=True,
                         options=hr.Options(seed=9))


@pytest.mark.parametrize("sampler_kind", ["random", "distributed"])
def test_a_state_saved_at_an_epochs_last_batch_skips_nothing_of_the_next(
        sampler_kind, tmp_path, no_leaks):
    """save_state in the loop's body after an epoch's last batch, then load_state and
    skip_first_batches(loader, 10) for that epoch (the batches it had done), as a script that
    counts its steps per epoch resumes: the state is between epochs, and the helper skipped the
    next epoch's 10 batches (every later epoch one permutation late), where torch's loader
    skips nothing of it. With a DistributedSampler the next epoch was also given the finished
    epoch's set_epoch (Accelerate counts an epoch once the loop asks past its last batch)."""
    loader = _epoch_end_loader(sampler_kind)
    prepared = hr_accel.prepare_data_loader(Accelerator(cpu=True), loader)
    reference = [[i for b in prepared for i in b.tolist()] for _ in range(2)]
    loader.close()
    acc = Accelerator(cpu=True)  # (save_state saves every loader registered with it)
    loader = _epoch_end_loader(sampler_kind)
    prepared = hr_accel.prepare_data_loader(acc, loader)
    for step, _ in enumerate(prepared):
        if step == 9:  # the epoch's last batch
            acc.save_state(tmp_path / "ckpt")
    loader.close()
    acc2 = Accelerator(cpu=True)
    loader2 = _epoch_end_loader(sampler_kind)
    prepared2 = hr_accel.prepare_data_loader(acc2, loader2)
    acc2.load_state(tmp_path / "ckpt")
    assert [b for b in hr_accel.skip_first_batches(prepared2, 10)] == []
    assert [i for b in prepared2 for i in b.tolist()] == reference[1] != reference[0]
    loader2.close()


class Failing(IndexDataset):
    """Samples 1, 2, 3 and 5 raise (skipped with ``on_error="skip"``)."""

    def __getitem__(self, i: int) -> int:
        if i in (1, 2, 3, 5):
            raise ValueError(f"bad sample {i}")
        return super().__getitem__(i)


def test_skip_first_batches_counts_short_batches_as_batches(tmp_path, no_leaks):
    # three batches with four skipped samples among them: [0], [4, 6, 7], [8..11]; counted from
    # the 8 samples delivered they were two, and the pattern skipped [12..15] besides
    before, prepared, loader = saved_then_restored(tmp_path, lambda: hr.DataLoader(
        Failing(32), batch_size=4, options=hr.Options(on_error="skip")))
    after = [i for b in hr_accel.skip_first_batches(prepared, 3) for i in b.tolist()]
    assert before == [0, 4, 6, 7, 8, 9, 10, 11] and after == list(range(12, 32))
    loader.close()


class Pairs(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i])


@pytest.mark.parametrize("n", [10, 11])  # 11: the ranks' shares are padded
def test_a_shard_of_a_shuffled_loader_keeps_its_samples_and_their_form(n, no_leaks):
    # the sharding for uneven datasets cut batch_size=None loaders into batches of one
    # (each sample came wrapped in a list: [tensor([0, 0])] where 10 samples gave tensor([5, 5]))
    def shards(**kw):
        base = hr.DataLoader(Pairs(n), shuffle=True, options=hr.Options(seed=1), **kw)
        out = [hr_accel._shard(base, 2, rank) for rank in (0, 1)]
        return [[x for x in shard] for shard in out]

    unbatched = shards(batch_size=None)
    assert all(isinstance(x, torch.Tensor) and x.shape == (2,) for s in unbatched for x in s)
    assert sorted({int(x[0]) for s in unbatched for x in s}) == list(range(n))
    batched = shards(batch_size=4)
    seen = [int(i) for s in batched for b in s for i in b[:, 0]]
    assert sorted(set(seen)) == list(range(n)) and len(seen) >= n


def test_skip_first_batches_keeps_headrace_or_raises(no_leaks):
    acc = Accelerator(cpu=True)
    loader = hr.DataLoader(IndexDataset(20), batch_size=4, num_workers=2)
    prepared = hr_accel.prepare_data_loader(acc, loader)
    skipped = hr_accel.skip_first_batches(prepared, 2)
    assert skipped.base_dataloader is loader
    assert [i for b in skipped for i in b.tolist()] == list(range(8, 20))
    plain = acc.skip_first_batches(prepared, 2)  # Accelerate's own: a torch loader, so it raises
    with pytest.raises(hr.HeadraceError, match="skip_first_batches"):
        next(iter(plain))
    loader.close()


def test_a_prepared_loader_pickles_with_headrace_inside(no_leaks):
    import pickle

    acc = Accelerator(cpu=True)
    loader = hr.DataLoader(IndexDataset(12), batch_size=4, num_workers=2)
    clone = pickle.loads(pickle.dumps(hr_accel.prepare_data_loader(acc, loader)))
    assert isinstance(clone, hr_accel.HeadraceShard)
    assert type(clone.base_dataloader) is hr.DataLoader
    assert [i for b in clone for i in b.tolist()] == list(range(12))
    clone.base_dataloader.close()
