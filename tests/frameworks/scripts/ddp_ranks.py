"""One DDP rank under ``torchrun``: iterate headrace loaders over a ``DistributedSampler`` in
several configurations and record what this rank got (``<out>/rank<r>.json``).

Every batch is followed by an ``all_reduce``, as DDP's gradient sync is: a rank with fewer
batches than the others would leave them waiting, and gloo's timeout turns that into an error.
    torchrun --standalone --nproc_per_node=W ddp_ranks.py OUT
"""

from __future__ import annotations

import datetime
import json
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from tests.helpers import FailingDataset
from torch.utils.data import DistributedSampler

import headrace as hr
from headrace.planner.workers import available_cpus, rank_cpus

# (name, dataset size, batch size, loader drop_last, sampler shuffle, in_order, bad indices)
CASES = [
    ("even", 48, 4, False, True, None, ()),
    ("uneven", 29, 4, False, True, None, ()),
    ("uneven_drop_last", 29, 4, True, True, None, ()),
    ("skip", 32, 3, False, False, False, (0, 4, 5)),
    ("skip_drop_last", 32, 3, True, False, False, (0, 4, 5)),
]


def run_case(name, n, bs, drop_last, shuffle, in_order, bad):
    ds = FailingDataset(n, set(bad))
    sampler = DistributedSampler(ds, shuffle=shuffle, seed=3)
    loader = hr.DataLoader(ds, batch_size=bs, sampler=sampler, num_workers=1,
                           drop_last=drop_last, in_order=in_order,
                           options=hr.Options(on_error="skip" if bad else "raise"))
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        batches = []
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for batch in loader:
                batches.append(batch.tolist())
                dist.all_reduce(torch.ones(1))  # DDP's sync: hangs if a rank ran out early
        epochs.append({"batches": batches, "assigned": list(sampler), "len": len(loader)})
    loader.close()
    return epochs


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    result = {"world": dist.get_world_size(), "cases": {}}
    for name, *args in CASES:
        result["cases"][name] = run_case(name, *args)
    # in_order=True: torch's own batches for this rank, batch for batch
    ds = FailingDataset(30, set())
    sampler = DistributedSampler(ds, shuffle=True, seed=5)
    ordered = hr.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1, in_order=True)
    torch_loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler)
    result["in_order_same_as_torch"] = [b.tolist() for b in ordered] == \
        [b.tolist() for b in torch_loader]
    shuffled = hr.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=1)
    result["shuffled_is_sample_aware"] = "sample-aware" in shuffled.explain()
    # a loader with torch's default sampler: every rank iterates it whole, with a warning
    plain = hr.DataLoader(FailingDataset(8, set()), batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result["plain"] = [i for b in plain for i in b.tolist()]
    result["plain_warnings"] = [str(w.message) for w in caught if "headrace" in str(w.message)]
    result["cpus"] = {"node": available_cpus(), "rank": rank_cpus(),
                      "auto_workers": int(hr.DataLoader(FailingDataset(8, set()),
                                                        num_workers="auto").num_workers)}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
