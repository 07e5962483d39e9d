"""The dataset's Compose-like object is the user's own while headrace measures its transforms
(``pipeline/inplace.py``): its attributes set between epochs, what it writes to itself, and a
``transform`` or ``transforms`` its class holds are seen as with torch's loader."""

import numpy as np
import pytest
import torch.utils.data as tud

import headrace as hr
from headrace.pipeline.timed import Timed
from tests.helpers import Compose

pytestmark = pytest.mark.integration

N = 4


def double(x):
    return x * 2


def add_one(x):
    return x + 1


class Knobbed:
    """A Compose with a curriculum knob (``offset``), a call counter it writes to itself and
    MONAI's ``set_random_state``, which replaces its own generator."""

    def __init__(self, transforms):
        self.transforms = transforms
        self.offset = 0
        self.calls = 0
        self.R = np.random.RandomState(0)

    def set_random_state(self, seed):
        self.R = np.random.RandomState(seed)
        return self

    def __call__(self, x):
        self.calls += 1
        for t in self.transforms:
            x = t(x)
        return x + self.offset


class Knobs(tud.Dataset):
    def __init__(self):
        self.transform = Knobbed([double, double])

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.transform(float(i))


class Draws(Knobs):
    """The Compose's generator drawn in ``__getitem__``: which one is drawn from shows."""

    def __getitem__(self, i):
        return self.transform(float(i)) + self.transform.R.randint(1000)


class Aliased(Knobs):
    """The Compose held under a second name too, its knob set per sample through that name."""

    def __init__(self):
        super().__init__()
        self.aug = self.transform

    def __getitem__(self, i):
        self.aug.offset = 10 * i
        return self.transform(float(i))


def epochs(loader_cls, dataset_cls, workers, change):
    """Three epochs, ``change(ds, epoch)`` before each; the batches and the user's call count."""
    ds = dataset_cls()
    loader = loader_cls(ds, batch_size=N, num_workers=workers)
    try:
        assert loader_cls is tud.DataLoader or loader.pipeline.embedded  # measured in place
        out = []
        for epoch in range(3):
            change(ds, epoch)
            out.append([b.tolist() for b in loader])
        assert not any(isinstance(t, Timed) for t in ds.transform.transforms)
    finally:
        getattr(loader, "close", lambda: None)()
    return out, ds.transform.calls


def set_offset(ds, epoch):
    ds.transform.offset = 100 * epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_a_compose_attribute_set_between_epochs_is_seen(workers, no_leaks):
    """A cached copy of the Compose ran each epoch with the first epoch's ``offset`` at
    ``num_workers=0``, and its call counter never reached the user's object."""
    ref = epochs(tud.DataLoader, Knobs, workers, set_offset)
    assert ref[0] == [[[4.0 * i + 100 * e for i in range(N)]] for e in range(3)]
    assert ref[1] == (3 * N if workers == 0 else 0)  # workers count on their own copies
    assert epochs(hr.DataLoader, Knobs, workers, set_offset) == ref


def test_a_compose_random_state_set_between_epochs_is_drawn_from(no_leaks):
    """MONAI's ``set_random_state`` on the Compose: each epoch draws from the generator set for
    it (num_workers=0 only: in workers the draws depend on which worker runs which sample)."""

    def reseed(ds, epoch):
        ds.transform.set_random_state(epoch)

    ref = epochs(tud.DataLoader, Draws, 0, reseed)
    assert ref[0][0] != ref[0][1]
    assert epochs(hr.DataLoader, Draws, 0, reseed) == ref


@pytest.mark.parametrize("workers", [0, 2])
def test_a_compose_changed_under_another_name_is_the_one_that_runs(workers, no_leaks):
    """``__getitem__`` sets the knob through a second reference to the Compose: a copy of the
    Compose in its place never saw it."""
    ref = epochs(tud.DataLoader, Aliased, workers, set_offset)
    assert ref[0] == [[[14.0 * i for i in range(N)]]] * 3
    assert epochs(hr.DataLoader, Aliased, workers, set_offset) == ref


def class_level(loader_cls, workers):
    """A ``transform`` the dataset class holds, replaced on the class after one epoch."""

    class DS(tud.Dataset):
        transform = Compose([double, double])

        def __len__(self):
            return N

        def __getitem__(self, i):
            return self.transform(float(i))

    ds = DS()
    loader = loader_cls(ds, batch_size=N, num_workers=workers)
    try:
        assert loader_cls is tud.DataLoader or loader.pipeline.embedded
        assert vars(ds) == {}  # constructing the loader wrote nothing onto the dataset
        first = [b.tolist() for b in loader]
        DS.transform = Compose([add_one, add_one])
        second = [b.tolist() for b in loader]
        assert vars(ds) == {}
    finally:
        getattr(loader, "close", lambda: None)()
    return first, second


@pytest.mark.parametrize("workers", [0, 2])
def test_a_class_level_transform_is_never_shadowed(workers, no_leaks):
    """Setting ``ds.transform`` to a copy and back left an instance attribute, which hid the
    class's new transform from then on."""
    ref = class_level(tud.DataLoader, workers)
    assert ref == ([[4.0 * i for i in range(N)]], [[i + 2.0 for i in range(N)]])
    assert class_level(hr.DataLoader, workers) == ref


class Preset:
    """A Compose whose ``transforms`` its class holds."""

    transforms = [double, double]

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class UsesPreset(tud.Dataset):
    def __init__(self):
        self.transform = Preset()

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.transform(float(i))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_class_level_transforms_list_is_never_shadowed(workers, no_leaks):
    """The wrappers set as the Compose's ``transforms`` are deleted, not replaced by the class's
    list, so a later change to the class is seen."""

    def run(loader_cls):
        ds = UsesPreset()
        loader = loader_cls(ds, batch_size=N, num_workers=workers)
        try:
            assert loader_cls is tud.DataLoader or loader.pipeline.embedded
            first = [b.tolist() for b in loader]
            assert vars(ds.transform) == {}
            Preset.transforms = [add_one, add_one]
            second = [b.tolist() for b in loader]
            assert vars(ds.transform) == {}
        finally:
            Preset.transforms = [double, double]
            getattr(loader, "close", lambda: None)()
        return first, second

    ref = run(tud.DataLoader)
    assert ref == ([[4.0 * i for i in range(N)]], [[i + 2.0 for i in range(N)]])
    assert run(hr.DataLoader) == ref


def add_ten(x):
    return x + 10


class LooksUp(tud.Dataset):
    """``__getitem__`` finds its transforms in the Compose's list by equality: ``index``,
    ``in``, a dict keyed by them. The list held headrace's timing wrappers there: ``index``
    raised ``ValueError``, ``in`` was False, the dict lookup raised ``KeyError``."""

    def __init__(self):
        self.transform = Knobbed([double, add_one])
        self.weights = {double: 100.0, add_one: 1000.0}

    def __len__(self):
        return N

    def __getitem__(self, i):
        ts = self.transform.transforms
        return (self.transform(float(i)) + ts.index(add_one) + 10.0 * (double in ts)
                + sum(self.weights[t] for t in ts))


class Grows(tud.Dataset):
    """``__getitem__`` appends a transform to the Compose's list in place, once: with torch's
    single-process loader every later sample gets it, and the list keeps it. The wrappers' list
    got it and was dropped when the user's list was put back: later samples ran without it."""

    def __init__(self):
        self.transform = Knobbed([double, double])

    def __len__(self):
        return N

    def __getitem__(self, i):
        if i == 1:
            self.transform.transforms.append(add_ten)
        return self.transform(float(i))


class Slices(Knobbed):
    """A Compose that keeps only its first transform from its second call on, by assigning a
    slice of its list (the wrappers' list while headrace measures it)."""

    def __call__(self, x):
        if self.calls == 1:
            self.transforms = self.transforms[:1]
        return super().__call__(x)


class Sliced(Knobs):
    def __init__(self):
        self.transform = Slices([double, double])


@pytest.mark.parametrize("workers", [0, 2])
def test_transforms_found_by_equality_inside_getitem(workers, no_leaks):
    def run(loader_cls):
        loader = loader_cls(LooksUp(), batch_size=N, num_workers=workers)
        try:
            return [b.tolist() for b in loader]
        finally:
            getattr(loader, "close", lambda: None)()

    ref = run(tud.DataLoader)
    assert ref == [[2.0 * i + 1 + 1 + 10 + 1100 for i in range(N)]]
    assert run(hr.DataLoader) == ref


@pytest.mark.parametrize("dataset_cls", [Grows, Sliced])
def test_a_transforms_list_changed_during_getitem_keeps_the_change(dataset_cls, no_leaks):
    # num_workers=0: the change is made to the training process's own dataset, as with torch
    def run(loader_cls):
        ds = dataset_cls()
        loader = loader_cls(ds, batch_size=1, num_workers=0)
        try:
            out = [b.tolist() for _ in range(2) for b in loader]
        finally:
            getattr(loader, "close", lambda: None)()
        ts = ds.transform.transforms
        assert not any(Timed in type(t).__mro__ for t in ts)
        return out, ts

    ref, ref_list = run(tud.DataLoader)
    got, got_list = run(hr.DataLoader)
    assert got == ref and got_list == ref_list
    assert all(a is b for a, b in zip(got_list, ref_list, strict=True))  # the user's functions
