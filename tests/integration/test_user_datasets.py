"""User datasets are never rewritten: what ``__getitem__`` computes is what the loader yields."""

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from tests.helpers import Compose

pytestmark = pytest.mark.integration

N = 24


class AsOne:
    """The same transforms behind a callable that is not Compose-like: the dataset run as it
    is, with nothing measured per step (the reference for 'unsplit')."""

    def __init__(self, compose):
        self.compose = compose

    def __call__(self, x):
        return self.compose(x)


def scale(x):
    return x * 3.0


def shift(x):
    return x + 0.5


def jitter(x):  # random through torch's global generator, as torchvision transforms draw
    return x + torch.rand(x.shape)


class Unconditional(tud.Dataset):
    """Calls its transform without checking for None, then post-processes the result."""

    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return N

    def __getitem__(self, i):
        x = self.transform(torch.full((4,), float(i)))
        return {"x": x.sum(0, keepdim=True) - x, "label": i}  # post-processing after it


class TwoViews(tud.Dataset):
    """Applies its transform twice (SimCLR-style) and to something other than element 0."""

    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return N

    def __getitem__(self, i):
        base = torch.full((4,), float(i))
        return i, self.transform(base), self.transform(base + 1)


def collect(loader):
    out = {}
    for batch in loader:
        if isinstance(batch, dict):
            for label, x in zip(batch["label"].tolist(), batch["x"], strict=True):
                out[label] = x.numpy().copy()
        else:
            for i, a, b in zip(batch[0].tolist(), batch[1], batch[2], strict=True):
                out[i] = np.concatenate([a.numpy(), b.numpy()])
    return out


@pytest.mark.parametrize("cls", [Unconditional, TwoViews])
@pytest.mark.parametrize("workers", [0, 2])
def test_deterministic_transforms_give_what_torch_gives(cls, workers, no_leaks):
    tf = Compose([scale, shift])
    ds = cls(tf)
    ref = collect(tud.DataLoader(ds, batch_size=4, num_workers=workers))
    loader = hr.DataLoader(ds, batch_size=4, num_workers=workers, shuffle=True)
    got = collect(loader)
    assert got.keys() == ref.keys() == set(range(N))
    for i in ref:
        np.testing.assert_array_equal(got[i], ref[i])
    assert ds.transform is tf and tf.transforms == [scale, shift]  # untouched
    assert loader.pipeline.step_names == ["load", "scale", "shift"]
    assert "as the dataset calls its transforms" in loader.explain()


@pytest.mark.parametrize("cls", [Unconditional, TwoViews])
def test_random_transforms_match_the_dataset_run_unsplit_seed_for_seed(cls, no_leaks):
    tf = Compose([scale, jitter, shift])
    opts = hr.Options(seed=9)
    measured = collect(hr.DataLoader(cls(tf), batch_size=4, num_workers=2, options=opts))
    unsplit = collect(hr.DataLoader(cls(AsOne(tf)), batch_size=4, num_workers=2, options=opts))
    assert measured.keys() == unsplit.keys() == set(range(N))
    for i in unsplit:
        np.testing.assert_array_equal(measured[i], unsplit[i])
    if cls is TwoViews:  # each call draws anew: view b is not view a shifted by 3 exactly
        assert not np.allclose(measured[3][4:] - measured[3][:4], 3.0)


def test_per_step_profile_of_an_embedded_transform(no_leaks):
    loader = hr.DataLoader(Unconditional(Compose([scale, shift])), batch_size=4, num_workers=2)
    for _ in loader:
        pass
    prof = loader.planning.profile()
    assert prof.samples == N
    assert [s.name for s in prof.steps] == ["load", "scale", "shift"]
    assert prof.step("scale").bytes_out_mean == 16  # four float32s


class NestedTensors(tud.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return torch.nested.nested_tensor([torch.arange(i + 1.0), torch.arange(2.0)])


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_holding_nested_tensors_arrive_as_torchs(workers, no_leaks):
    # the profiler's size reading raised on them: the worker died, or a bare RuntimeError
    want = list(tud.DataLoader(NestedTensors(), batch_size=None, num_workers=workers))
    loader = hr.DataLoader(NestedTensors(), batch_size=None, num_workers=workers)
    try:
        got = list(loader)
    finally:
        loader.close()
    assert len(got) == len(want) == 6
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind(), strict=True))
