"""Invariant 1: every index of the sampler's epoch is delivered exactly once, in every mode."""

from collections import Counter

import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration

N = 41


def flat(loader):
    out = []
    for b in loader:
        out.extend(b.tolist() if isinstance(b, torch.Tensor) else [b] if isinstance(b, int) else b)
    return out


@pytest.mark.parametrize("in_order", [False, True])
@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("batch_size", [1, 6])
def test_each_index_exactly_once(in_order, workers, drop_last, shuffle, batch_size):
    ds = IndexDataset(N, slow_every=7, slow_s=0.01)  # uneven costs reorder completions
    torch.manual_seed(1)
    expected = Counter(flat(tud.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)))
    torch.manual_seed(1)
    loader = hr.DataLoader(ds, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                           num_workers=workers, in_order=in_order)
    got = flat(loader)
    assert Counter(got) == expected
    if batch_size > 1:
        sizes = [len(b) for b in hr.DataLoader(ds, batch_size=batch_size, drop_last=drop_last,
                                               num_workers=workers, in_order=in_order)]
        assert all(s == batch_size for s in sizes[:-1]) and len(sizes) == len(loader)


def test_exactly_once_with_repeating_sampler_and_user_batch_sampler():
    ds = IndexDataset(10)
    sampler = tud.WeightedRandomSampler([1.0] * 10, num_samples=25, replacement=True,
                                        generator=torch.Generator().manual_seed(0))
    ref = Counter(flat(tud.DataLoader(ds, batch_size=4, sampler=sampler)))
    sampler.generator.manual_seed(0)
    assert Counter(flat(hr.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2))) == ref
    bs = [[0, 1, 2], [9], [3, 4], [5, 6, 7, 8]]
    got = [b.tolist() for b in hr.DataLoader(ds, batch_sampler=bs, num_workers=2)]
    assert sorted(map(sorted, got)) == sorted(map(sorted, bs))  # user groups kept whole


def test_autoscaled_workers_deliver_exactly_once():
    ds = IndexDataset(120, slow_every=3, slow_s=0.005)
    opts = hr.Options(autoscale=hr.AutoscaleConfig(initial=1, max_workers=3, interval_s=0.05))
    loader = hr.DataLoader(ds, batch_size=8, shuffle=True, num_workers="auto", options=opts)
    assert Counter(flat(loader)) == Counter(range(120))
    assert loader.stats().workers_timeline[0][1] == 1


def test_auto_workers_start_at_initial_after_a_pause_before_the_loop():
    """The scheduler ticks before the training thread forks the epoch's pool: past
    ``interval_s`` since the loader was built, its first tick decided on no workers and asked
    for more on top of the pool's start (``initial=1`` started 2: 12 of 12 runs)."""
    ds = IndexDataset(48)
    opts = hr.Options(autoscale=hr.AutoscaleConfig(initial=1, max_workers=3, interval_s=0.05))
    loader = hr.DataLoader(ds, batch_size=8, num_workers="auto", options=opts)
    loader.monitor._last_scale -= 1.0  # built a second ago: the script built its model since
    assert Counter(flat(loader)) == Counter(range(48))
    assert loader.stats().workers_timeline[0][1] == 1, loader.stats().workers_timeline


class _FailsAt(IndexDataset):
    def __init__(self, n: int, bad: set[int]) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise ValueError(f"sample {i} is bad")
        return i


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_drop_last_counts_what_a_failed_sample_leaves_out(on_error):
    """Regrouped batches with drop_last stay full: when a failed sample leaves the last batch
    short, its samples are dropped, and counted (they were not, and looked lost)."""
    loader = hr.DataLoader(_FailsAt(100, {3, 50}), batch_size=4, num_workers=2, drop_last=True,
                           in_order=False, options=hr.Options(on_error=on_error))
    got, raised = [], 0
    it = iter(loader)
    while True:
        try:
            b = next(it)
        except StopIteration:
            break
        except hr.StepError:
            raised += 1
            continue
        assert len(b) == 4
        got.extend(b.tolist())
    e = loader.stats().last
    assert len(got) == len(set(got)) and not {3, 50} & set(got)
    assert (e.skipped_samples, e.failed_samples, raised) == ((2, 0, 0) if on_error == "skip"
                                                            else (0, 2, 2))
    assert e.dropped_samples == 98 - len(got) == 2  # 98 good samples: 24 batches and 2 left
    assert "dropped 2 (drop_last)" in loader.explain()
