"""A dataset with a Compose-like transform is the user's live object, never a copy: what the
user, ``worker_init_fn`` and ``__getitem__`` do to it is seen, as with torch's loader, while its
transforms are still measured step by step (``pipeline/inplace.py``)."""

import copy
import pickle
import threading

import numpy as np
import pytest
import torch.utils.data as tud

import headrace as hr
from headrace.pipeline.inplace import EmbeddedSource
from headrace.pipeline.timed import Probe, Probing, Timed
from tests.helpers import Compose

pytestmark = pytest.mark.integration

N = 6


def add_one(x):
    return x + 1


def times_ten(x):
    return x * 10


def minus_two(x):
    return x - 2


class Epoched(tud.Dataset):
    """The set_epoch pattern: the training loop writes ``ds.epoch`` between epochs."""

    def __init__(self):
        self.transform = Compose([add_one])
        self.epoch = 0

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.transform(i) + 100 * self.epoch


def run_epochs(loader_cls, workers):
    """Three epochs, the dataset changed between them as a training script would."""
    ds = Epoched()
    loader = loader_cls(ds, batch_size=N, num_workers=workers)
    out = []
    try:
        for epoch in range(3):
            ds.epoch = epoch
            if epoch == 1:
                ds.transform = Compose([times_ten])  # as many transforms: still measured
            if epoch == 2:
                ds.transform = Compose([times_ten, minus_two])  # another count: unmeasured
            out.append([b.tolist() for b in loader])
            assert isinstance(ds.transform, Compose)
            assert not any(isinstance(t, Timed) for t in ds.transform.transforms)
    finally:
        getattr(loader, "close", lambda: None)()
    return out, ds


@pytest.mark.parametrize("workers", [0, 2])
def test_changes_to_the_dataset_between_epochs_are_seen(workers, no_leaks):
    ref, _ = run_epochs(tud.DataLoader, workers)
    got, ds = run_epochs(hr.DataLoader, workers)
    assert ref == [[list(range(1, N + 1))], [[100 + 10 * i for i in range(N)]],
                   [[200 + 10 * i - 2 for i in range(N)]]]
    assert got == ref


@pytest.mark.parametrize("workers", [0, 2])
def test_a_transform_no_longer_compose_like_still_delivers(workers, no_leaks):
    ds = Epoched()
    loader = hr.DataLoader(ds, batch_size=N, num_workers=workers)
    try:
        assert loader.pipeline.embedded
        ds.transform = times_ten  # a plain function: the dataset runs as it is, unmeasured
        assert [b.tolist() for b in loader] == [[10 * i for i in range(N)]]
        assert ds.transform is times_ten
    finally:
        loader.close()


class Handle(tud.Dataset):
    """The LMDB / h5py pattern: a handle opened in ``__init__`` that ``__getstate__`` drops."""

    def __init__(self):
        self.transform = Compose([add_one])
        self.env = {i: 10 + i for i in range(N)}

    def __getstate__(self):
        state = self.__dict__.copy()
        state["env"] = None
        return state

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.transform(self.env[i])


def test_a_handle_dropped_by_getstate_is_kept_at_num_workers_0(no_leaks):
    ref = [b.tolist() for b in tud.DataLoader(Handle(), batch_size=3)]
    loader = hr.DataLoader(Handle(), batch_size=3)
    try:
        assert loader.pipeline.embedded
        assert [b.tolist() for b in loader] == ref == [[11, 12, 13], [14, 15, 16]]
    finally:
        loader.close()


class Lazy(tud.Dataset):
    """A handle opened per worker by ``worker_init_fn`` on ``get_worker_info().dataset``."""

    def __init__(self):
        self.transform = Compose([add_one])
        self.handle = None

    def __len__(self):
        return N

    def __getitem__(self, i):
        if self.handle is None:
            raise RuntimeError("handle not opened")
        return self.transform(i) + 1000 * int(self.handle == "open")


def open_handle(worker_id):
    tud.get_worker_info().dataset.handle = "open"


def test_worker_init_fn_setup_is_seen_by_getitem(no_leaks):
    ref = [b.tolist() for b in tud.DataLoader(Lazy(), batch_size=2, num_workers=2,
                                              worker_init_fn=open_handle)]
    loader = hr.DataLoader(Lazy(), batch_size=2, num_workers=2, worker_init_fn=open_handle)
    try:
        assert loader.pipeline.embedded
        assert [b.tolist() for b in loader] == ref
    finally:
        loader.close()
    assert ref == [[1001 + i, 1002 + i] for i in range(0, N, 2)]


class Counting(tud.Dataset):
    """Writes to ``self`` in ``__getitem__``, which torch's num_workers=0 lets the user see."""

    def __init__(self):
        self.transform = Compose([add_one, times_ten])
        self.seen = []

    def __len__(self):
        return N

    def __getitem__(self, i):
        self.seen.append(i)
        self.last = i
        return self.transform(float(i))


def test_getitem_writes_land_on_the_users_object_and_transform_is_restored(no_leaks):
    ds = Counting()
    tf, parts = ds.transform, list(ds.transform.transforms)
    loader = hr.DataLoader(ds, batch_size=2, num_workers=0)
    try:
        assert [b.tolist() for b in loader] == [[10.0 * (i + 1), 10.0 * (i + 2)]
                                                for i in range(0, N, 2)]
        assert sorted(ds.seen) == list(range(N)) and ds.last in range(N)
        assert ds.transform is tf and tf.transforms == parts  # identity, list untouched
        it = iter(loader)  # an epoch abandoned midway leaves it as well
        next(it)
        del it
        assert ds.transform is tf
        prof = loader.planning.profile()
        assert [s.name for s in prof.steps] == ["load", "add_one", "times_ten"]
        assert prof.step("add_one").count >= N and prof.step("times_ten").bytes_out_mean > 0
    finally:
        loader.close()
    assert ds.transform is tf


class Frozen(tud.Dataset):
    """``transform`` is a read-only property: headrace never sets it, so it is still measured."""

    def __init__(self, tf):
        self._tf = tf

    @property
    def transform(self):
        return self._tf

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.transform(i)


class FrozenList(Compose):
    """A Compose whose ``transforms`` is a read-only property: the wrappers cannot be set."""

    def __init__(self, transforms):
        self._transforms = transforms

    @property
    def transforms(self):
        return self._transforms


@pytest.mark.parametrize("compose, measured", [(Compose, True), (FrozenList, False)])
def test_only_a_transforms_list_that_cannot_be_set_makes_the_dataset_opaque(compose, measured,
                                                                             no_leaks):
    ds = Frozen(compose([add_one]))
    tf = ds.transform
    loader = hr.DataLoader(ds, batch_size=N)
    try:
        assert loader.pipeline.embedded == measured and loader.pipeline.opaque != measured
        assert [b.tolist() for b in loader] == [[i + 1 for i in range(N)]]
        assert ds.transform is tf and tf.transforms == [add_one]
    finally:
        loader.close()


THREADS, LOADS = 4, 40
_meet = threading.Barrier(THREADS, timeout=30)


def meeting_add_one(x):
    _meet.wait()  # every thread is inside a load at once, each round: the swaps interleave
    return x + 1


def test_threads_sharing_the_dataset_measure_every_call_and_restore_it():
    ds = Epoched()
    ds.transform = tf = Compose([meeting_add_one, times_ten])
    src = EmbeddedSource(ds, 2)
    errors, probes = [], []

    def work(offset):
        for k in range(LOADS):
            i = (offset + k) % N
            probe = Probe(2, None, lambda position, call: None)
            with Probing(probe):
                got = src.load(i)
            probes.append(probe)
            if got != (i + 1) * 10:
                errors.append((i, got))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    assert len(probes) == THREADS * LOADS
    assert all(p.calls == [1, 1] and p.wall[0] > 0 for p in probes)  # each call measured once
    assert ds.transform is tf and tf.transforms == [meeting_add_one, times_ten]


def noise(x, rng):
    return x + rng.random()


def test_a_random_step_gets_its_rng_under_threads_as_under_processes(no_leaks):
    def run(executor):
        ds = Epoched()
        ds.transform = tf = Compose([add_one, hr.step(noise, random=True)])
        loader = hr.DataLoader(ds, batch_size=N, num_workers=2,
                               options=hr.Options(seed=3, executor=executor))
        try:
            out = [b.tolist() for b in loader]
        finally:
            loader.close()
        assert ds.transform is tf
        return out

    threads, processes = run("threads"), run("processes")
    assert threads == processes
    drawn = np.array(threads[0]) - np.arange(1, N + 1)  # noise: one draw in [0, 1)
    assert ((drawn >= 0) & (drawn < 1)).all() and len(set(drawn.tolist())) == N


def test_the_source_pickles_without_its_lock():
    import pickle

    ds = Epoched()
    src = pickle.loads(pickle.dumps(EmbeddedSource(ds, 1)))
    assert src.load(2) == 3 and isinstance(src.dataset.transform, Compose)


class Scale:
    def __init__(self):
        self.factor = 1.0

    def __call__(self, x):
        return x * self.factor


class SetsItsTransform(tud.Dataset):
    """Multi-scale style: ``__getitem__`` sets its transform's parameter from the index."""

    def __init__(self):
        self.transform = Compose([Scale()])

    def __len__(self):
        return 4

    def __getitem__(self, i):
        self.transform.transforms[0].factor = float(i + 1)
        return self.transform(1.0)


@pytest.mark.parametrize("workers", [0, 2])
def test_writes_through_the_transform_reach_the_users_transform(workers, no_leaks):
    want = list(tud.DataLoader(SetsItsTransform(), batch_size=None, num_workers=workers))
    loader = hr.DataLoader(SetsItsTransform(), batch_size=None, num_workers=workers,
                           in_order=True)
    try:
        assert [float(x) for x in loader] == [float(x) for x in want] == [1.0, 2.0, 3.0, 4.0]
    finally:
        loader.close()


def test_two_loaders_over_one_dataset_leave_the_users_transform_in_place():
    # a train and a val loader over one dataset, their loads interleaved (worker threads):
    # the second runs on the first's installed wrappers and never takes them for the user's
    inside, gate = threading.Event(), threading.Event()

    class Waits(tud.Dataset):
        def __init__(self):
            self.transform = Compose([add_one])

        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 0:  # the first loader's load stays inside __getitem__
                inside.set()
                assert gate.wait(30)
            return self.transform(i)

    ds = Waits()
    user = ds.transform
    first = hr.Pipeline.from_dataset(ds).source
    second = hr.Pipeline.from_dataset(ds).source
    got = []
    t = threading.Thread(target=lambda: got.append(first.load(0)))
    t.start()
    assert inside.wait(30)  # the first load has installed its wrappers
    assert ds.transform is user and isinstance(user.transforms[0], Timed)
    assert second.load(1) == 2
    gate.set()
    t.join(30)
    assert got == [1] and ds.transform is user
    assert not any(isinstance(x, Timed) for x in user.transforms)


class Fixed:
    def __call__(self, x):
        return x + 1000


class Jitter:
    def __call__(self, x):
        return x + 1


class Resumable:
    """A Compose that can start part-way (MONAI's ``Compose.__call__(start=...)``)."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x, start=0):
        for t in self.transforms[start:]:
            x = t(x)
        return x


class CachedPrefix(tud.Dataset):
    """MONAI's ``CacheDataset`` pattern: the transforms before the first random one ran at
    construction (cached); ``__getitem__`` finds where to resume with ``isinstance``."""

    def __init__(self):
        self.transform = Resumable([Fixed(), Jitter()])
        self.cache = [self.transform.transforms[0](i) for i in range(N)]

    def __len__(self):
        return N

    def __getitem__(self, i):
        ts = self.transform.transforms
        start = next(k for k, t in enumerate(ts) if isinstance(t, Jitter)
                     or not isinstance(t, (Fixed, Jitter)))
        looks = ([type(t).__name__ for t in ts], [t.__class__ for t in ts],
                 [type(copy.deepcopy(t)) for t in ts], [type(pickle.loads(pickle.dumps(t)))
                                                        for t in ts])
        return self.transform(self.cache[i], start=start), looks


@pytest.mark.parametrize("workers", [0, 2])
def test_getitem_sees_its_own_transform_classes(workers, no_leaks):
    """The measured copy's wrappers passed ``isinstance`` for nothing: a cached prefix ran a
    second time (1000 added twice, silently, MONAI's ``CacheDataset`` and
    ``PersistentDataset``, whose disk cache then held the wrong values for torch too)."""
    ref = list(tud.DataLoader(CachedPrefix(), batch_size=None, num_workers=workers))
    loader = hr.DataLoader(CachedPrefix(), batch_size=None, num_workers=workers,
                           options=hr.Options(profile_store=False))
    try:
        assert loader.pipeline.embedded  # still measured step by step
        got = list(loader)
    finally:
        loader.close()
    assert [v for v, _ in ref] == [1001 + i for i in range(N)]
    assert got == ref
    assert list(ref[0][1]) == [["Fixed", "Jitter"], [Fixed, Jitter], [Fixed, Jitter], [Fixed, Jitter]]


class Pairs:
    """A Compose whose list holds (transform, probability) pairs, not transforms."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for t, p in self.transforms:
            if p >= 1.0:
                x = t(x)
        return x


class Named:
    """A Compose whose list names its own methods."""

    def __init__(self, transforms):
        self.transforms = transforms

    def negate(self, x):
        return -x

    def shift(self, x):
        return x + 100

    def __call__(self, x):
        for name in self.transforms:
            x = getattr(self, name)(x)
        return x


class Plain(tud.Dataset):
    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return N

    def __getitem__(self, i):
        return self.transform(i)


@pytest.mark.parametrize("transform", [lambda: Pairs([(add_one, 1.0), (times_ten, 1.0)]),
                                       lambda: Named(["negate", "shift"])])
def test_a_transforms_list_of_anything_but_callables_runs_as_it_is(transform, no_leaks):
    """It raised at construction ("step 'tuple': fn must be callable")."""
    ref = list(tud.DataLoader(Plain(transform()), batch_size=None))
    loader = hr.DataLoader(Plain(transform()), batch_size=None, num_workers=2)
    try:
        assert not loader.pipeline.embedded
        assert sorted(loader) == sorted(ref)
    finally:
        loader.close()


class PrivateCopy(tud.Dataset):
    """A ``__getitem__`` that copies a transform to change it for one sample."""

    def __init__(self):
        self.transform = Compose([Scale()])

    def __len__(self):
        return N

    def __getitem__(self, i):
        t = copy.copy(self.transform.transforms[0])
        t.factor *= 2
        return int(t(1))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_copy_of_a_measured_transform_is_a_copy_of_the_users(workers, no_leaks):
    """copy.copy of a wrapper gave the user's transform itself: the per-sample change landed
    on it, and each sample doubled the last (2, 4, 8, ...)."""
    ref = [int(x) for x in tud.DataLoader(PrivateCopy(), batch_size=None, num_workers=workers)]
    loader = hr.DataLoader(PrivateCopy(), batch_size=None, num_workers=workers, in_order=True,
                           options=hr.Options(profile_store=False))
    try:
        assert loader.pipeline.embedded
        assert [int(x) for x in loader] == ref == [2] * N
    finally:
        loader.close()
