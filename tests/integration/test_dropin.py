"""headrace.DataLoader is a torch DataLoader: type, iterator protocol, pickling, rebuilding."""

import collections
import copy
import pickle

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from headrace.runtime.options import AutoWorkers
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration


def flat(loader_or_iter):
    return [i for b in loader_or_iter for i in b.tolist()]


def test_is_a_torch_dataloader_and_generic():
    loader = hr.DataLoader(IndexDataset(8), batch_size=2)
    assert isinstance(loader, tud.DataLoader)
    alias = hr.DataLoader[list[torch.Tensor]]  # a user module annotated this way must import
    assert alias.__origin__ is hr.DataLoader


@pytest.mark.parametrize("attr", ["batch_size", "batch_sampler", "sampler", "drop_last",
                                  "dataset", "persistent_workers"])
def test_frozen_attributes_raise_like_torch(attr):
    loader = hr.DataLoader(IndexDataset(8), batch_size=2)
    with pytest.raises(ValueError, match=f"{attr} attribute should not be set"):
        setattr(loader, attr, None)


@pytest.mark.parametrize("workers", [0, 2])
def test_iterators_are_independent(workers, no_leaks):
    loader = hr.DataLoader(IndexDataset(24), batch_size=4, num_workers=workers)
    pairs = list(zip(loader, loader, strict=True))
    assert len(pairs) == 6
    assert [a.tolist() for a, _ in pairs] == [b.tolist() for _, b in pairs]
    first = iter(loader)
    head = next(first).tolist()
    rest_of_second = flat(iter(loader))  # a whole second epoch while the first is open
    assert rest_of_second == list(range(24))
    assert head + flat(first) == list(range(24))  # the first goes on where it was


@pytest.mark.parametrize("workers", [0, 2])
def test_len_of_an_iterator_is_the_loaders(workers, no_leaks):
    loader = hr.DataLoader(IndexDataset(10), batch_size=3, num_workers=workers)
    it = iter(loader)
    assert len(it) == len(loader) == 4
    del it


def test_a_replaced_persistent_iterator_raises_instead_of_ending(no_leaks):
    loader = hr.DataLoader(IndexDataset(16), batch_size=4, num_workers=2, persistent_workers=True)
    old = iter(loader)
    next(old)
    new = iter(loader)
    with pytest.raises(RuntimeError, match="replaced by a newer iter"):
        next(old)
    assert sorted(flat(new)) == list(range(16))
    loader.close()


def test_shuffle_false_keeps_dataset_order_with_workers(no_leaks):
    ds = IndexDataset(64, slow_every=5, slow_s=0.01)  # slow samples would be overtaken
    loader = hr.DataLoader(ds, batch_size=4, num_workers=2)
    assert flat(loader) == list(range(64))
    assert "torch's order" in loader.explain()


def test_random_order_is_regrouped_by_default(no_leaks):
    loader = hr.DataLoader(IndexDataset(16), batch_size=4, shuffle=True, num_workers=2)
    assert sorted(flat(loader)) == list(range(16))
    assert "sample-aware" in loader.explain()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_pickle_and_deepcopy_give_a_working_loader(workers, how, no_leaks):
    loader = hr.DataLoader(IndexDataset(20), batch_size=4, num_workers=workers, shuffle=True,
                           options=hr.Options(seed=3))
    it = iter(loader)
    next(it)  # a running epoch and its workers are not part of the copy
    clone = pickle.loads(pickle.dumps(loader)) if how == "pickle" else copy.deepcopy(loader)
    assert type(clone) is hr.DataLoader and clone.options == loader.options
    assert sorted(flat(clone)) == list(range(20))
    del it
    loader.close()


def test_rebuilding_from_attributes_keeps_auto_workers_and_options(no_leaks):
    """What Lightning and Accelerate do to inject a sampler: call the class again with the
    instance's attributes named like ``__init__``'s parameters."""
    opts = hr.Options(seed=5, on_error="skip")
    loader = hr.DataLoader(IndexDataset(12), batch_size=3, num_workers="auto", options=opts)
    assert isinstance(loader.num_workers, AutoWorkers) and loader.num_workers >= 1
    attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
    import inspect

    params = inspect.signature(hr.DataLoader.__init__).parameters
    kwargs = {k: v for k, v in attrs.items() if k in params and k not in ("sampler", "batch_sampler")}
    kwargs["sampler"] = tud.SequentialSampler(range(6))
    kwargs.pop("batch_size")
    rebuilt = hr.DataLoader(batch_size=3, **kwargs)
    assert type(rebuilt) is hr.DataLoader
    assert rebuilt.autoscale and rebuilt.options == opts
    assert flat(rebuilt) == list(range(6))
    rebuilt.close()


class SeedOfSample(tud.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.initial_seed()


def seeds_torch(worker_id):
    torch.manual_seed(12345)


def draws_only(worker_id):
    torch.rand(3)


def test_a_seed_set_in_worker_init_fn_is_overridden_and_said_once(no_leaks):
    with pytest.warns(UserWarning,
                      match="worker_init_fn seeded the global generator of torch,") as rec:
        got = [s for b in hr.DataLoader(SeedOfSample(), batch_size=2, num_workers=2,
                                        worker_init_fn=seeds_torch) for s in b.tolist()]
    assert 12345 not in got  # per-sample seeding reached __getitem__ instead
    assert sum("worker_init_fn seeded" in str(w.message) for w in rec) == 1


def test_drawing_in_worker_init_fn_is_not_taken_for_seeding(no_leaks, recwarn):
    list(hr.DataLoader(SeedOfSample(), batch_size=2, num_workers=2, worker_init_fn=draws_only))
    assert not [w for w in recwarn if "worker_init_fn seeded" in str(w.message)]


def seeds_numpy(worker_id):
    np.random.seed(7)


def test_a_seed_set_in_worker_init_fn_on_numpys_global_generator_is_said_too(no_leaks):
    with pytest.warns(UserWarning, match="worker_init_fn seeded the global generator of numpy,"):
        list(hr.DataLoader(SeedOfSample(), batch_size=2, num_workers=2,
                           worker_init_fn=seeds_numpy))


def test_another_global_numpy_bit_generator_and_a_worker_init_fn_work_as_with_torch(no_leaks):
    # np.random.set_bit_generator (NumPy >= 1.25): np.random.get_state() is a dict then, and
    # reading it as the Mersenne Twister's tuple failed every worker's start (torch's loader ran)
    before = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(5))
    try:
        got = [s for b in hr.DataLoader(SeedOfSample(), batch_size=2, num_workers=2,
                                        worker_init_fn=draws_only) for s in b.tolist()]
    finally:
        np.random.set_bit_generator(before)
    assert len(got) == 8


class Growing(tud.Dataset):
    def __init__(self):
        self.items = []

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_empty_dataset_gives_no_batch_and_one_filled_later_its_samples(workers, no_leaks):
    ds = Growing()
    loader = hr.DataLoader(ds, batch_size=2, num_workers=workers)
    try:
        assert len(loader) == 0 and list(loader) == []
        ds.items += [1, 2, 3]  # filled after the loader was built, as torch allows
        assert flat(loader) == [1, 2, 3]
    finally:
        loader.close()


def test_num_workers_may_be_a_numpy_integer(no_leaks):
    loader = hr.DataLoader(IndexDataset(6), batch_size=2, num_workers=np.int64(2))
    try:
        assert loader.num_workers == 2 and type(loader.num_workers) is int
        assert sorted(flat(loader)) == list(range(6))
    finally:
        loader.close()


class Batched(tud.Dataset):
    """Answers torch's batched fetch (``__getitems__``) otherwise than ``__getitem__``."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return -i

    def __getitems__(self, indices):
        return [10 * i for i in indices]


class OnlyBatched(tud.Dataset):
    def __len__(self):
        return 6

    def __getitems__(self, indices):
        return [10 * i for i in indices]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("dataset, batch_size", [(Batched, 3), (OnlyBatched, 3), (Batched, None)])
def test_getitems_is_used_where_torch_uses_it(dataset, batch_size, workers, no_leaks):
    # torch fetches a batch through __getitems__ when the dataset has it, and single samples
    # (batch_size=None) through __getitem__; headrace asks __getitems__ for batches of one
    kw = dict(batch_size=batch_size, num_workers=workers, collate_fn=lambda b: b)
    want = list(tud.DataLoader(dataset(), **kw))
    loader = hr.DataLoader(dataset(), in_order=True, **kw)
    try:
        assert list(loader) == want
    finally:
        loader.close()


class NoLen(tud.Dataset):
    """A map-style dataset without __len__: torch iterates it with an explicit sampler."""

    def __getitem__(self, i):
        return 2 * i


class AbstractLen(NoLen):
    """An abstract base's ``__len__`` (``raise NotImplementedError``): no length either (it
    raised at ``iter()``, and the profile store could not key the dataset)."""

    def __len__(self):
        raise NotImplementedError


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kw", [dict(sampler=range(5), batch_size=2),
                                dict(batch_sampler=[[0, 1], [2, 3, 4]]),
                                dict(sampler=range(5), batch_size=None)])
@pytest.mark.parametrize("NoLen", [NoLen, AbstractLen])
def test_a_dataset_without_len_runs_with_an_explicit_sampler(NoLen, kw, workers, no_leaks):  # noqa: N803
    want = [b if isinstance(b, int) else b.tolist()
            for b in tud.DataLoader(NoLen(), num_workers=workers, **kw)]
    loader = hr.DataLoader(NoLen(), num_workers=workers, in_order=True, **kw)
    try:
        assert [b if isinstance(b, int) else b.tolist() for b in loader] == want
        assert "? samples" in loader.explain()
        it = iter(loader)
        first = next(it)
        state = loader.state_dict()  # and it resumes: the rest, exactly
        del it
        again = hr.DataLoader(NoLen(), num_workers=workers, in_order=True, **kw)
        again.load_state_dict(state)
        rest = [b if isinstance(b, int) else b.tolist() for b in again]
        again.close()
        assert [first if isinstance(first, int) else first.tolist()] + rest == want
    finally:
        loader.close()


class CorruptSample(Exception):
    def __init__(self, path, code):
        super().__init__(f"bad file {path}")
        self.path, self.code = path, code


class Corrupt(tud.Dataset):
    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i == 2:
            if self.kind == "user":
                raise CorruptSample(f"/data/{i}.jpg", 7)
            raise FileNotFoundError(2, "No such file", f"/data/{i}.jpg")
        return i


@pytest.mark.parametrize("workers", [0, 2])
def test_a_step_error_is_the_users_exception_with_its_attributes(workers, no_leaks):
    # torch re-raises the object at num_workers=0 (and only its type, when it can, from workers)
    for kind, cls, attrs in (("user", CorruptSample, {"path": "/data/2.jpg", "code": 7}),
                             ("os", FileNotFoundError, {"errno": 2, "filename": "/data/2.jpg"})):
        loader = hr.DataLoader(Corrupt(kind), batch_size=1, num_workers=workers, in_order=True)
        try:
            with pytest.raises(cls) as info:
                list(loader)
        finally:
            loader.close()
        assert isinstance(info.value, hr.StepError) and info.value.index == 2
        assert {k: getattr(info.value, k, None) for k in attrs} == attrs
        assert "sample index 2" in str(info.value)
        # and after pickling (a DDP launcher or a multiprocessing pool sends it on)
        again = pickle.loads(pickle.dumps(info.value))
        assert isinstance(again, cls) and isinstance(again, hr.StepError) and again.index == 2
        assert {k: getattr(again, k, None) for k in attrs} == attrs


class StartsOver:
    """A batch sampler whose ``__iter__`` returns itself and starts over (Lightning's wrapper
    for ``trainer.predict`` is one)."""

    def __init__(self, batches):
        self.batches, self.calls = batches, 0

    def __iter__(self):
        self.calls += 1
        self._it = iter(self.batches)
        return self

    def __next__(self):
        return next(self._it)

    def __len__(self):
        return len(self.batches)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_that_starts_over_on_iter_is_iterated_once_per_epoch(workers, no_leaks):
    batches = [[0, 1, 2], [3, 4, 5], [6, 7]]
    sampler = StartsOver(batches)
    loader = hr.DataLoader(IndexDataset(8), batch_sampler=sampler, num_workers=workers)
    try:
        assert [b.tolist() for b in loader] == batches
        assert sampler.calls == 1
    finally:
        loader.close()


class Boxes(torch.Tensor):
    """A tensor subclass with metadata (as torchvision's ``tv_tensors.BoundingBoxes``)."""

    @staticmethod
    def __new__(cls, data, fmt):
        t = torch.Tensor._make_subclass(cls, torch.as_tensor(data))
        t.fmt = fmt
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class Exotic(tud.Dataset):
    """Tensors NumPy cannot view, a subclass with an attribute, a parameter."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        complex_ = torch.arange(3.0).to(torch.cfloat) * (1 + 2j) + i
        return {"f8": (torch.ones(3) * i).to(torch.float8_e4m3fn),
                "c32": torch.ones(3, dtype=torch.chalf) * i,
                "conj": complex_.conj(),
                "neg": complex_.conj().imag,  # a negative view
                "both": torch._neg_view(complex_.conj()),
                "ring": (torch.arange(1024.0).to(torch.cfloat) * (1 + 2j) + i).conj(),  # 8 KB
                "boxes": Boxes(torch.ones(2, 4) * i, "XYXY"),
                "w": torch.nn.Parameter(torch.ones(3) * i)}


def _described(sample):
    return {k: (type(v).__name__, v.dtype, v.is_conj(), v.is_neg(), v.requires_grad,
                getattr(v, "fmt", None), v.resolve_conj().resolve_neg().to(torch.cfloat).tolist())
            for k, v in sample.items()}


@pytest.mark.parametrize("workers", [0, 2])
def test_tensors_arrive_with_their_dtype_type_and_attributes_as_from_torch(workers, no_leaks):
    # float8 and complex32 have no NumPy dtype and a conjugate view no NumPy view: a worker
    # died on them; a subclass lost its type and attributes, a parameter its requires_grad;
    # a conjugate or negative view came conjugated back (torch's workers still drop the bit:
    # compared with what the dataset gives, torch's num_workers=0)
    def run(cls, w, **kw):
        loader = cls(Exotic(), batch_size=3, num_workers=w, collate_fn=list, **kw)
        try:
            return [_described(s) for b in loader for s in b]
        finally:
            getattr(loader, "close", lambda: None)()

    assert run(hr.DataLoader, workers, in_order=True) == run(tud.DataLoader, 0)


class Columns(tud.Dataset):
    """Forwards unknown names to its columns and raises KeyError for others (not AttributeError)."""

    def __init__(self):
        self._cols = {"label": list(range(6))}

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return self._cols["label"][i]

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._cols[name]


def test_a_dataset_whose_getattr_raises_keyerror_loads_as_with_torch(no_leaks):
    loader = hr.DataLoader(Columns(), batch_size=3, num_workers=2, in_order=True)
    try:
        assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5]]
    finally:
        loader.close()


class MyList(list):
    pass


class Containers(tud.Dataset):
    """Containers that are subclasses of what torch's collate walks, and a NumPy subclass."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"dd": collections.defaultdict(list, {"x": torch.ones(2) * i}),
                "mine": MyList([i, 2]), "max": torch.max(torch.ones(2, 3) * i, dim=1),
                "matrix": np.matrix(np.ones((40, 40)) * i)}  # 12.8 KB: a ring-sized leaf


@pytest.mark.parametrize("workers", [0, 2])
def test_containers_and_array_subclasses_keep_their_types_as_with_torch(workers, no_leaks):
    def run(cls, **kw):
        loader = cls(Containers(), batch_size=2, num_workers=workers, collate_fn=list, **kw)
        try:
            return [(type(s["dd"]), s["dd"].default_factory, type(s["mine"]), s["mine"],
                     type(s["max"]), s["max"].values.tolist(), type(s["matrix"]),
                     s["matrix"].sum()) for b in loader for s in b]
        finally:
            getattr(loader, "close", lambda: None)()

    assert run(hr.DataLoader, in_order=True) == run(tud.DataLoader)
    loader = hr.DataLoader(Containers(), batch_size=2, num_workers=workers)  # default collate
    try:
        assert all(type(b["dd"]) is collections.defaultdict for b in loader)
    finally:
        loader.close()


def _init_cannot_open(worker_id):
    raise FileNotFoundError(2, "cannot open the database", "/data/db")


def _init_custom(worker_id):
    raise CorruptSample("/data/db", code=3)


@pytest.mark.parametrize("init, cls", [(_init_cannot_open, OSError), (_init_custom, CorruptSample)])
def test_a_failing_worker_init_fn_raises_its_own_type_as_in_torch(init, cls, no_leaks):
    # torch re-raises a worker_init_fn's OSError as an OSError: `except OSError` must catch it
    loader = hr.DataLoader(IndexDataset(8), batch_size=2, num_workers=2, worker_init_fn=init)
    try:
        with pytest.raises(cls) as info:
            list(loader)
    finally:
        loader.close()
    assert isinstance(info.value, hr.WorkerDiedError) and "failed to start" in str(info.value)
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again, cls) and str(again) == str(info.value)


def _second_worker_cannot_open(worker_id):
    if worker_id == 1:
        raise FileNotFoundError(2, "cannot open the database", "/data/db")


def test_a_worker_init_fn_failing_in_one_worker_is_raised_even_when_the_others_finish_first(
        no_leaks):
    # a short epoch ended on worker 0 before worker 1's error was read: no error at all
    # (torch, whose every worker takes a turn, raises it); half the runs of a sweep's script
    for _ in range(3):
        loader = hr.DataLoader(IndexDataset(8), batch_size=4, num_workers=2,
                               worker_init_fn=_second_worker_cannot_open)
        try:
            with pytest.raises(OSError, match="failed to start"):
                list(loader)
        finally:
            loader.close()


class GradSamples(tud.Dataset):
    """Non-leaf tensors that require grad: torch refuses to pickle them (a RuntimeError)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.ones(2, requires_grad=True) * i


def test_a_sample_that_cannot_be_sent_raises_the_senders_error_type(no_leaks):
    loader = hr.DataLoader(GradSamples(), batch_size=2, num_workers=2)
    try:
        with pytest.raises(RuntimeError, match="could not be sent") as info:
            list(loader)  # torch's loader raises a RuntimeError here too
    finally:
        loader.close()
    assert isinstance(info.value, hr.StepError) and info.value.step == "transport"
