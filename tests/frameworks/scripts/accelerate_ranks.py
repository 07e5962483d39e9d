"""One rank of an Accelerate run under ``torchrun`` (gloo, CPU), recording what it saw in
``<out>/<phase>_rank<r>.json``.
    torchrun --standalone --nproc_per_node=2 accelerate_ranks.py OUT train|resume
train: gradient-accumulation sync pattern with torch's loader and with headrace's (two epochs),
the indices headrace gave this rank; then a second loader (shuffled, no seed of its own): one
epoch, two batches of the next, ``save_state``, stop.
resume: a fresh loader and accelerator, ``load_state``, the rest of that epoch (no
``set_epoch`` of the script's own, as in Accelerate's examples).
gather: ``gather_for_metrics`` over evaluation loaders (``shuffle=False``) of several lengths
and batch sizes, with torch's loader and with headrace's (run on 3 ranks and more: the padding
of the last step is where they differed), and over a shuffled headrace loader of each.
droplast: ``gather_for_metrics`` over ``drop_last=True`` loaders whose dataset does not fill the
last global step, torch's loader and headrace's prepared alike.
samplers: every rank's global generator seeded apart; loaders over random samplers other than
``shuffle=True`` (two epochs each), and one over a ``SubsetRandomSampler``: an epoch, two
batches of the next, ``save_state``, then the rest of that epoch and one more.
samplers_resume: that loader fresh (the global generator seeded otherwise), ``load_state``, the
rest of the saved epoch and one more.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.utils.data as tud
from accelerate import Accelerator
from accelerate.utils import set_seed
from tests.helpers import IndexDataset

import headrace as hr
from headrace.integrations.accelerate import prepare, prepare_data_loader

N, BS = 44, 4
DROP_LAST_CASES = ((10, 4, False), (45, 4, True), (20, 3, False))
"""(dataset length, batch size, shuffle) of the ``droplast`` phase: on 2 ranks none fills
its last global step, and a shuffled one of odd length is dealt in whole batches."""
SAMPLES = 40
"""Dataset length of the ``samplers`` phases."""


def random_samplers() -> dict[str, dict]:
    """A loader's arguments for each random order other than ``shuffle=True``."""
    return {
        "subset": {"sampler": tud.SubsetRandomSampler(range(SAMPLES)), "batch_size": BS},
        "weighted": {"sampler": tud.WeightedRandomSampler([1.0] * SAMPLES, SAMPLES,
                                                          replacement=False), "batch_size": BS},
        "batch_sampler": {"batch_sampler": tud.BatchSampler(
            tud.SubsetRandomSampler(range(SAMPLES)), BS, drop_last=False)},
    }


def run_epochs(acc, model, loader, epochs=2):
    syncs, seen = [], []
    for _ in range(epochs):
        seen.append([])
        for batch in loader:
            with acc.accumulate(model):
                seen[-1].extend(batch.tolist())
                syncs.append(acc.sync_gradients)
    return syncs, seen


def resumable_loader():
    # no seed: the DistributedSampler's is drawn at prepare(), another in a resumed process
    return hr.DataLoader(IndexDataset(N), batch_size=BS, shuffle=True, num_workers=1)


def main() -> None:
    out, phase = Path(sys.argv[1]), sys.argv[2]
    set_seed(0)
    acc = Accelerator(gradient_accumulation_steps=3, cpu=True)
    result = {"world": acc.num_processes}
    if phase == "gather":
        result["gathered"] = []
        for n, bs in ((7, 3), (10, 2), (13, 4), (29, 3)):
            torch_loader = acc.prepare(tud.DataLoader(IndexDataset(n), batch_size=bs))
            loader = prepare_data_loader(acc, hr.DataLoader(IndexDataset(n), batch_size=bs))
            shuffled = prepare_data_loader(acc, hr.DataLoader(
                IndexDataset(n), batch_size=bs, shuffle=True, options=hr.Options(seed=n)))
            result["gathered"].append([n] + [
                [i for b in dl for i in acc.gather_for_metrics(b).tolist()]
                for dl in (torch_loader, loader, shuffled)])
            loader.base_dataloader.close()
            shuffled.base_dataloader.close()
        acc.even_batches = False  # no padding: the last ranks get fewer samples
        result["uneven"] = []
        for n, bs in ((7, 3), (13, 4), (29, 3)):
            torch_loader = acc.prepare(tud.DataLoader(IndexDataset(n), batch_size=bs))
            loader = prepare_data_loader(acc, hr.DataLoader(IndexDataset(n), batch_size=bs))
            shuffled = prepare_data_loader(acc, hr.DataLoader(
                IndexDataset(n), batch_size=bs, shuffle=True, options=hr.Options(seed=n)))
            result["uneven"].append([n] + [[b.tolist() for b in dl]
                                           for dl in (torch_loader, loader, shuffled)])
            loader.base_dataloader.close()
            shuffled.base_dataloader.close()
    elif phase == "droplast":
        result["gathered"] = []
        for n, bs, shuffle in DROP_LAST_CASES:
            kw = {"batch_size": bs, "shuffle": shuffle, "drop_last": True}
            torch_loader = acc.prepare(tud.DataLoader(
                IndexDataset(n), generator=torch.Generator().manual_seed(0), **kw))
            loader = prepare_data_loader(acc, hr.DataLoader(
                IndexDataset(n), num_workers=1, options=hr.Options(seed=0), **kw))
            result["gathered"].append([n, bs, shuffle] + [
                [i for b in dl for i in acc.gather_for_metrics(b).tolist()]
                for dl in (torch_loader, loader)])
            loader.base_dataloader.close()
    elif phase in ("samplers", "samplers_resume"):
        torch.manual_seed((100 if phase == "samplers" else 200) + acc.process_index)
        prepared = prepare_data_loader(acc, hr.DataLoader(
            IndexDataset(SAMPLES), sampler=tud.SubsetRandomSampler(range(SAMPLES)),
            batch_size=BS, num_workers=1))
        if phase == "samplers":
            result["epoch0"] = [i for b in prepared for i in b.tolist()]
            it = iter(prepared)
            result["before"] = [i for _ in range(2) for i in next(it).tolist()]
            acc.save_state(out / "ckpt_samplers")
        else:
            acc.load_state(out / "ckpt_samplers")
            it = iter(prepared)
        result["rest"] = [i for b in it for i in b.tolist()]
        result["next"] = [i for b in prepared for i in b.tolist()]
        prepared.base_dataloader.close()
        if phase == "samplers":
            result["epochs"] = {}
            for name, kwargs in random_samplers().items():
                loader = prepare_data_loader(acc, hr.DataLoader(
                    IndexDataset(SAMPLES), num_workers=1, **kwargs))
                result["epochs"][name] = [[i for b in loader for i in b.tolist()]
                                          for _ in range(2)]
                loader.base_dataloader.close()
    elif phase == "train":
        model = torch.nn.Linear(1, 1)
        model, torch_loader = acc.prepare(model, tud.DataLoader(IndexDataset(N), batch_size=BS,
                                                                shuffle=True))
        result["torch_syncs"], _ = run_epochs(acc, model, torch_loader)
        loader = hr.DataLoader(IndexDataset(N), batch_size=BS, shuffle=True, num_workers=1)
        model2, prepared = prepare(acc, torch.nn.Linear(1, 1), loader)
        result["type"] = type(prepared.base_dataloader).__name__
        result["syncs"], result["seen"] = run_epochs(acc, model2, prepared)
        loader.close()
        second = prepare_data_loader(acc, resumable_loader())
        result["epoch0"] = [i for b in second for i in b.tolist()]
        it = iter(second)  # epoch 1: Accelerate gives the sampler set_epoch(1)
        result["before"] = [i for _ in range(2) for i in next(it).tolist()]
        acc.save_state(out / "ckpt")
        del it
        second.base_dataloader.close()
    else:
        # Accelerate matches saved loader states to loaders by the order they were prepared in
        acc.prepare(tud.DataLoader(IndexDataset(N), batch_size=BS))
        prepare_data_loader(acc, hr.DataLoader(IndexDataset(N), batch_size=BS))
        prepared = prepare_data_loader(acc, resumable_loader())
        acc.load_state(out / "ckpt")
        result["after"] = [i for b in prepared for i in b.tolist()]
        prepared.base_dataloader.close()
    (out / f"{phase}_rank{acc.process_index}.json").write_text(json.dumps(result))
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
