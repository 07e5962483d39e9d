"""headrace.DataLoader keeps torch.utils.data.DataLoader's semantics, keyword by keyword."""

import threading

import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from tests.helpers import IndexDataset, RangeIterable, RichDataset, WorkerInfoDataset, init_fn

pytestmark = pytest.mark.integration


def batches(loader):
    return [b.tolist() if isinstance(b, torch.Tensor) else b for b in loader]


def both(seed, **kw):
    ds = kw.pop("dataset", IndexDataset(37))
    torch.manual_seed(seed)
    ref = batches(tud.DataLoader(ds, **kw))
    torch.manual_seed(seed)
    got = batches(hr.DataLoader(ds, in_order=True, **kw))
    return ref, got


@pytest.mark.parametrize("workers", [0, 3])
@pytest.mark.parametrize(
    "kw",
    [
        {"batch_size": 5, "shuffle": True},
        {"batch_size": 5, "shuffle": True, "drop_last": True},
        {"batch_size": 4, "shuffle": False},
        {"batch_size": None, "shuffle": True},
        {"batch_size": 1},
        {"sampler": list(range(36, -1, -2)), "batch_size": 3},
        {"batch_sampler": [[3, 1], [0], [5, 6, 7]]},
    ],
)
def test_in_order_reproduces_torch_order_and_batches(workers, kw, no_leaks):
    ref, got = both(7, num_workers=workers, **kw)
    assert got == ref


def test_generator_keyword_drives_the_order_like_torch():
    ds = IndexDataset(30)
    ref = batches(tud.DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(3)))
    got = batches(hr.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, in_order=True,
                                generator=torch.Generator().manual_seed(3)))
    assert got == ref


def test_len_matches_torch():
    for kw in ({"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": None}):
        assert len(hr.DataLoader(IndexDataset(37), **kw)) == len(tud.DataLoader(IndexDataset(37), **kw))


def test_default_collation_matches_torch_for_every_type(no_leaks):
    ref = list(tud.DataLoader(RichDataset(), batch_size=4))
    got = list(hr.DataLoader(RichDataset(), batch_size=4, num_workers=2, in_order=True))
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert a.keys() == b.keys()
        assert torch.equal(a["tensor"], b["tensor"]) and torch.equal(a["array"], b["array"])
        assert torch.equal(a["int"], b["int"]) and a["int"].dtype == b["int"].dtype
        assert torch.equal(a["float"], b["float"]) and a["float"].dtype == b["float"].dtype
        assert a["str"] == b["str"]
        assert torch.equal(a["tuple"][0], b["tuple"][0]) and torch.equal(a["tuple"][1], b["tuple"][1])
        assert type(a["named"]) is type(b["named"]) and torch.equal(a["named"].y, b["named"].y)
        assert [t.tolist() for t in a["list"]] == [t.tolist() for t in b["list"]]


def test_custom_collate_and_no_auto_collation(no_leaks):
    got = list(hr.DataLoader(IndexDataset(5), batch_size=2, collate_fn=lambda b: tuple(b), num_workers=2, in_order=True))
    assert got == [(0, 1), (2, 3), (4,)]
    got = list(hr.DataLoader(IndexDataset(3), batch_size=None, num_workers=2, in_order=True))
    assert got == [0, 1, 2]  # default_convert leaves ints as they are, like torch


def test_worker_info_and_worker_init_fn(no_leaks):
    loader = hr.DataLoader(WorkerInfoDataset(), batch_size=None, num_workers=2,
                           worker_init_fn=init_fn, collate_fn=lambda x: x)
    rows = list(loader)
    assert sorted(r[0] for r in rows) == list(range(16))
    assert {r[1] for r in rows} <= {0, 1} and {r[2] for r in rows} == {2}
    assert all(r[4] == 100 + r[1] for r in rows)  # worker_init_fn ran in that worker
    assert all(r[5] for r in rows)  # info.dataset is set
    assert hr.get_worker_info() is None  # main process


def test_iterable_dataset_behaves_as_torch(no_leaks):
    ref = sorted(sum(batches(tud.DataLoader(RangeIterable(20), batch_size=3, num_workers=2)), []))
    got = sorted(sum(batches(hr.DataLoader(RangeIterable(20), batch_size=3, num_workers=2)), []))
    assert got == ref == list(range(20))


@pytest.mark.parametrize(
    "kw",
    [
        {"num_workers": -1},
        {"timeout": -1},
        {"batch_sampler": [[0]], "batch_size": 2},
        {"sampler": [0, 1], "shuffle": True},
        {"prefetch_factor": 2},
        {"persistent_workers": True},
        {"num_workers": "many"},
    ],
)
def test_invalid_arguments_raise_like_torch(kw):
    with pytest.raises((ValueError, TypeError)):
        hr.DataLoader(IndexDataset(4), **kw)


def test_prefetch_factor_zero_with_workers_raises():
    # torch's iter() asserts prefetch_factor > 0 (its constructor refuses negative ones);
    # headrace read ahead as if it were 2
    with pytest.raises(ValueError, match="prefetch_factor must be at least 1"):
        hr.DataLoader(IndexDataset(4), num_workers=2, prefetch_factor=0)


def test_timeout_keyword_raises_when_a_batch_is_late(no_leaks):
    loader = hr.DataLoader(IndexDataset(4, slow_every=1, slow_s=2.0), batch_size=2, num_workers=1, timeout=0.2)
    with pytest.raises(RuntimeError, match="timed out"):
        next(iter(loader))


def test_spawn_context_and_persistent_workers_reuse_processes(no_leaks):
    loader = hr.DataLoader(WorkerInfoDataset(), batch_size=4, num_workers=2,
                           multiprocessing_context="spawn", persistent_workers=True,
                           collate_fn=lambda b: b, prefetch_factor=3)
    pools = []
    try:
        for _ in range(2):
            rows = [r for b in loader for r in b]
            assert sorted(r[0] for r in rows) == list(range(16))
            workers = {w.process.pid for w in loader._pool.workers.values()}
            # which worker ran what depends on start-up speed (spawn imports for ~1 s); that the
            # samples came from the pool's processes, and the same ones each epoch, does not
            assert {r[3] for r in rows} <= workers
            pools.append(workers)
        assert pools[0] == pools[1] and len(pools[0]) == 2
    finally:
        loader.close()


def test_pin_memory_without_accelerator_still_delivers(no_leaks):
    with pytest.warns(UserWarning):
        got = batches(hr.DataLoader(IndexDataset(6), batch_size=3, num_workers=1, pin_memory=True, in_order=True))
    assert got == [[0, 1, 2], [3, 4, 5]]


class MeetInCollate:
    """A collate_fn that returns only once two collations run at the same time (a rendezvous,
    not a timing): proof that a user collate_fn is not run one batch after another."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=20)
        self.lock = threading.Lock()
        self.calls = 0
        self.met = 0

    def __call__(self, samples):
        # the first two calls on the collate threads meet (the first batches run in the
        # training loop, watched for random draws: runtime/collate_rng.py); which calls those
        # are is decided under a lock (deciding by `met`, counted after the barrier, let a
        # third call wait alone when a thread that had met was slow to count it: CPU load)
        if not threading.current_thread().name.startswith("headrace-collate"):
            return torch.tensor(samples)
        with self.lock:
            first_two = self.calls < 2
            self.calls += 1
        if first_two:
            self.barrier.wait()  # raises BrokenBarrierError if the other never comes
            with self.lock:
                self.met += 1
        return torch.tensor(samples)


def test_collate_threads_run_a_thread_safe_collate_fn_beside_the_scheduler_concurrently(
        no_leaks):
    # one call at a time is the default (test_collate_and_batching.py); Options(collate_threads)
    # The first four batches are collated in the training loop (watched); the scheduler
    # queues batches for the loop until the fourth is collated, up to 16 samples (the
    # in-flight bound) past the 12 yielded by then: batch 7 at most. 32 samples left batch 8
    # alone, or 7 and 8, to the threads, as the two threads' timing fell (one full run in six
    # broke the barrier); of 64, batches 8-16 go to the threads, and while the loop waits for
    # batch 8 the workers finish batch 9 (44 samples may be pulled then).
    collate = MeetInCollate()
    loader = hr.DataLoader(IndexDataset(64), batch_size=4, num_workers=2, shuffle=True,
                           collate_fn=collate, options=hr.Options(collate_threads=2))
    got = sorted(i for b in loader for i in b.tolist())
    assert got == list(range(64)) and collate.met == 2


def failing_collate(samples):
    if 13 in samples:
        raise ValueError("cannot collate 13")
    return torch.tensor(samples)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_collate_fn_error_raises_for_its_batch_and_the_epoch_goes_on(workers, no_leaks):
    loader = hr.DataLoader(IndexDataset(20), batch_size=4, num_workers=workers, in_order=True,
                           collate_fn=failing_collate)
    it, got, errors = iter(loader), [], []
    for _ in range(50):
        try:
            got.append(next(it).tolist())
        except StopIteration:
            break
        except hr.StepError as e:
            errors.append((e.step, e.index))
            # the batch is named, not its first sample as if that one had failed
            assert str(e).startswith("step 'collate_fn' failed on a batch (its first sample "
                                     "index 12)") and "[12, 13, 14, 15]" in str(e)
    assert errors == [("collate_fn", 12)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [16, 17, 18, 19]]


class CarrierDataset(tud.Dataset):
    """A leaf of each way a sample travels from a worker process: in the ring (``ringed``),
    pickled inline (``small``), through torch's shared memory (``big``, over a quarter of the
    ring; ``raw``, bytes over transport's inline limit), and inside a dict subclass (``dd``)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import collections

        import numpy as np

        from headrace.runtime.transport import INLINE_LIMIT

        return {"ringed": torch.full((2048,), float(i)), "small": torch.arange(4) + i,
                "big": np.full((1200, 1000), i, np.float32), "raw": bytes([i]) * (INLINE_LIMIT + 8),
                "dd": collections.defaultdict(list, {"t": torch.arange(3) + i})}


def _same(a, b):
    import numpy as np

    if isinstance(a, (torch.Tensor, np.ndarray)):
        return type(a) is type(b) and a.dtype == b.dtype and bool((a == b).all())
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("collate_fn", [None, list])
def test_every_carrier_a_worker_uses_arrives_as_torch_delivers_it(collate_fn, no_leaks):
    kw = {"batch_size": 2, "collate_fn": collate_fn} if collate_fn else {"batch_size": 2}
    ref = list(tud.DataLoader(CarrierDataset(), num_workers=2, **kw))
    got = list(hr.DataLoader(CarrierDataset(), num_workers=2, in_order=True, **kw))
    assert len(got) == len(ref) == 2
    assert all(_same(a, b) for a, b in zip(got, ref, strict=True))


class _LengthUnknown(tud.Sampler):
    """A sampler whose ``__len__`` raises what a stream's length may (not ``TypeError``)."""

    def __iter__(self):
        return iter(range(10))

    def __len__(self):
        raise NotImplementedError("length unknown")


class _NoLen(tud.Sampler):
    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def test_a_sampler_whose_len_raises_is_iterated_as_torch_does(no_leaks):
    """torch asks a sampler's length only for ``len(loader)``; headrace asked it at every epoch
    start and raised the sampler's error from ``iter()``."""
    kw = {"sampler": _LengthUnknown(), "batch_size": 4}
    ref = batches(tud.DataLoader(list(range(10)), num_workers=2, **kw))
    got = batches(hr.DataLoader(list(range(10)), num_workers=2, in_order=True, **kw))
    assert got == ref == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kw", [{"sampler": _NoLen(range(12)), "batch_size": 4},
                                {"batch_sampler": _NoLen([[0, 1, 2], [3, 4], [5]])}])
def test_state_dict_of_a_loader_whose_sampler_has_no_length(workers, kw, no_leaks):
    """``state_dict()`` mid-epoch raised ``TypeError`` (it recorded ``len(loader)``); now the
    batches per epoch are recorded as unknown and a new loader resumes the rest."""
    loader = hr.DataLoader(IndexDataset(12), num_workers=workers, in_order=True, **kw)
    it = iter(loader)
    first = next(it).tolist()
    sd = loader.state_dict()
    del it
    assert sd["batches_per_epoch"] is None
    again = hr.DataLoader(IndexDataset(12), num_workers=workers, in_order=True, **kw)
    again.load_state_dict(sd)
    rest = [i for b in batches(again) for i in b]
    whole = [i for b in batches(hr.DataLoader(IndexDataset(12), in_order=True, **kw)) for i in b]
    assert sorted(first + rest) == sorted(whole) and len(first + rest) == len(whole)
