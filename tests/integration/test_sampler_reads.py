"""The sampler is read in the training thread, as torch reads it (``runtime/feed.py``)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration


class LazyGlobal(tud.Sampler):
    """Draws each index from torch's global generator as it yields it (a custom random
    sampler; torch's own draw once, at their first element)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            yield int(torch.randint(0, self.n, ()).item())


def _run(make, n=40):
    """(batches, the training loop's own draws after each batch), from a seeded start."""
    torch.manual_seed(0)
    got, draws = [], []
    for b in make(n):
        got.append(b.tolist())
        draws.append(torch.rand(1).item())  # a training step's randomness (dropout)
    return got, draws


def _headrace(in_order):
    return lambda n: hr.DataLoader(IndexDataset(n), batch_size=4, sampler=LazyGlobal(n),
                                   num_workers=2, in_order=in_order, timeout=60)


def test_a_sampler_drawing_from_the_global_generator_is_reproducible_with_workers(no_leaks):
    """Read on the scheduler thread, its draws interleaved with the training loop's by thread
    timing: 3 of 4 seeded runs differed from each other (other samples, other loop draws)."""
    runs = [_run(_headrace(True)) for _ in range(3)]
    assert all(r == runs[0] for r in runs)
    ref = _run(lambda n: tud.DataLoader(IndexDataset(n), batch_size=4, sampler=LazyGlobal(n),
                                        num_workers=2))
    # prefetch_factor 2 x 2 workers x batch 4: headrace reads as far ahead as torch here
    assert runs[0] == ref
    out_of_order = [_run(_headrace(False)) for _ in range(3)]
    assert all(sorted(sum(r[0], [])) == sorted(sum(ref[0], [])) for r in out_of_order)
    assert all(r[1] == ref[1] for r in out_of_order)  # the loop's draws untouched


@pytest.mark.parametrize("workers, prefetch", [(1, 2), (2, 1), (3, 2)])
def test_torchs_order_reads_the_sampler_as_far_ahead_as_torch(workers, prefetch, no_leaks):
    """Where a batch keeps torch's content, the read-ahead is torch's prefetch_factor x workers
    batches; with one worker or a prefetch_factor of 1 it was two batches plus one sample per
    worker, one read more than torch: other batches and other loop draws."""
    def loader(cls, **kw):
        return lambda n: cls(IndexDataset(n), batch_size=4, sampler=LazyGlobal(n),
                             num_workers=workers, prefetch_factor=prefetch, **kw)

    assert _run(loader(hr.DataLoader, in_order=True, timeout=60)) == _run(loader(tud.DataLoader))


class RaisesAfter(tud.Sampler):
    def __iter__(self):
        yield from range(5)
        raise ValueError("the sampler broke")


@pytest.mark.parametrize("in_order", [True, False])
def test_a_sampler_error_comes_after_the_samples_it_gave_before(in_order, no_leaks):
    """It ended the epoch at once, dropping samples in flight (how many: thread timing); now
    they are delivered, then the error, as torch does without workers."""
    for _ in range(2):
        got = []
        loader = hr.DataLoader(IndexDataset(10), batch_size=1, sampler=RaisesAfter(),
                               num_workers=2, in_order=in_order, timeout=60)
        with pytest.raises(ValueError, match="the sampler broke"):
            for b in loader:
                got += b.tolist()
        assert sorted(got) == [0, 1, 2, 3, 4] and (not in_order or got == [0, 1, 2, 3, 4])


class FailsOn(tud.Dataset):
    def __init__(self, n, bad):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise KeyError(f"sample {i} is corrupt")
        return i


def test_skipped_samples_leave_room_the_training_thread_fills(no_leaks):
    """The training thread reads ahead of the samples it was delivered; when skipped samples
    leave fewer than a batch among those read (13 of the first 16 fail), the scheduler asks it
    for more while it waits for a batch, instead of both waiting for ever."""
    bad = set(range(16)) - {1, 5, 9}
    loader = hr.DataLoader(FailsOn(40, bad), batch_size=4, num_workers=2, shuffle=False,
                           in_order=False, timeout=60, options=hr.Options(on_error="skip"))
    got = sorted(i for b in loader for i in b.tolist())
    assert got == sorted(set(range(40)) - bad)


def _failing_collate(batch):
    if min(batch) < 24:
        raise ValueError(f"cannot collate {batch}")
    return torch.tensor(batch)


def test_batches_whose_collate_fn_raised_leave_room_for_the_rest(no_leaks):
    """Six batches (24 samples, more than the 16 the feed keeps ahead) raise in the training
    loop, which goes on: their samples are settled there, or the feed would stop reading and
    the epoch wait for ever."""
    loader = hr.DataLoader(IndexDataset(40), batch_size=4, num_workers=2, shuffle=False,
                           collate_fn=_failing_collate, timeout=60)
    it, got, raised = iter(loader), [], 0
    for _ in range(40):  # bounded: ten batches, then the end
        try:
            got += next(it).tolist()
        except StopIteration:
            break
        except hr.StepError:
            raised += 1
    assert raised == 6 and got == list(range(24, 40))


def test_an_epoch_ended_by_a_sampler_error_is_freed_without_the_garbage_collector(no_leaks):
    from headrace.runtime.scheduler import Scheduler

    gc.collect()
    before = sum(isinstance(o, Scheduler) for o in gc.get_objects())
    gc.disable()
    try:
        loader = hr.DataLoader(IndexDataset(10), batch_size=1, sampler=RaisesAfter(),
                               num_workers=2, timeout=60)
        with pytest.raises(ValueError, match="the sampler broke"):
            for _ in loader:
                pass
        loader.close()
        del loader
        assert sum(isinstance(o, Scheduler) for o in gc.get_objects()) == before
    finally:
        gc.enable()


class Preempted(BaseException):
    """What a preemption handler or Ctrl-C raises in the training thread."""


class InterruptedOnce(tud.Sampler):
    """Raises ``Preempted`` (or ``error``) once, when element ``at`` is read, then yields on;
    a resumed loader gets a fresh one (a replay reads it again)."""

    def __init__(self, n, at, error=Preempted):
        self.n, self.at, self.error, self.fired = n, at, error, False

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            if i == self.at and not self.fired:
                self.fired = True
                raise self.error("preempted")
            yield i


@pytest.mark.parametrize("error", [Preempted, ValueError])
def test_an_interrupted_sampler_read_loses_no_sample_on_resume(error, no_leaks):
    """The training thread reads the sampler when it delivers a batch: marking the batch
    first and then reading lost it (delivered for state_dict(), never returned), and an
    epoch ended by the sampler's error counted as finished, so a resume skipped its rest."""
    n = 40
    loader = hr.DataLoader(IndexDataset(n), batch_size=4, sampler=InterruptedOnce(n, 24, error),
                           num_workers=2, in_order=True, timeout=60)
    got = []
    with pytest.raises(error):
        for b in loader:
            got += b.tolist()
    sd = loader.state_dict()
    loader.close()
    assert sd["in_epoch"] and sd["delivered_count"] == len(got)
    again = hr.DataLoader(IndexDataset(n), batch_size=4, sampler=InterruptedOnce(n, -1),
                          num_workers=2, in_order=True, timeout=60)
    again.load_state_dict(sd)
    rest = [i for b in again for i in b.tolist()]
    again.close()
    assert sorted(got + rest) == list(range(n))


def test_an_abandoned_epoch_drops_what_it_queued(no_leaks):
    """A loop that left before the sampler's error was taken kept the error, and with it the
    scheduler's frames, the feed and the queued batches, until the garbage collector ran."""
    from headrace.runtime.feed import Feed

    gc.collect()
    gc.disable()
    try:
        loader = hr.DataLoader(IndexDataset(10), batch_size=1, sampler=RaisesAfter(),
                               num_workers=2, timeout=60)
        it = iter(loader)
        next(it), next(it)  # the feed has now read up to the sampler's error (4 ahead)
        it.scheduler._thread.join(30)  # it ends once the rest and the error are queued
        assert it.scheduler._finished
        del it
        loader.close()
        assert sum(isinstance(o, Feed) for o in gc.get_objects()) == 0
    finally:
        gc.enable()


def _draw_between_iter_and_next(make):
    """(what the training loop drew between ``iter()`` and the first ``next()``, the epoch)."""
    torch.manual_seed(0)
    it = iter(make())
    between = torch.rand(3).tolist()  # a model built after iter(loader), in a step-based loop
    return between, [b.tolist() for b in it]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sampler", ["shuffle", "lazy"])
def test_without_workers_the_sampler_is_first_read_at_the_first_next(sampler, no_leaks):
    """torch's single-process iterator calls iter(sampler) at iter(loader) and reads it at the
    first next(): headrace read it at iter(), so a RandomSampler drew its permutation before
    the loop's own draws in between (other order, other loop values, also with in_order=True)."""
    def make(cls, **kw):
        extra = {"shuffle": True} if sampler == "shuffle" else {"sampler": LazyGlobal(12)}
        return lambda: cls(IndexDataset(12), batch_size=4, num_workers=0, **extra, **kw)

    ref = _draw_between_iter_and_next(make(tud.DataLoader))
    assert _draw_between_iter_and_next(make(hr.DataLoader, in_order=True)) == ref


class EagerGlobal(tud.Sampler):
    """Draws its whole order in ``__iter__`` (not a generator function): at ``iter(sampler)``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n).tolist())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("generator", [False, True, "eager"])
def test_without_workers_a_resume_replays_the_order_read_at_the_first_next(generator, no_leaks):
    """The order is drawn at the first next(), after the loop's draws since iter(): the saved
    epoch keeps the states of that read, so the resume delivers the rest of that order. A
    sampler that draws in __iter__ drew at iter(): replayed from the states of the first read,
    it drew another order (two samples twice, two never)."""
    def make(seed):
        if generator == "eager":  # batch_size=None: iter(loader) calls the sampler's __iter__
            return hr.DataLoader(IndexDataset(12), batch_size=None, sampler=EagerGlobal(12),
                                 num_workers=0, in_order=True)
        g = {"generator": torch.Generator().manual_seed(seed)} if generator else {}
        return hr.DataLoader(IndexDataset(12), batch_size=2, shuffle=True, num_workers=0,
                             in_order=True, **g)

    torch.manual_seed(0)
    loader = make(5)
    it = iter(loader)
    torch.rand(3)  # between iter() and the first next(): moves the global generator
    got, state = [], None
    for k, b in enumerate(it):
        got.append(torch.as_tensor(b).reshape(-1).tolist())
        if k == 1:
            state = loader.state_dict()
    torch.manual_seed(123)  # another process: another global generator
    again = make(99)
    again.load_state_dict(state)
    assert len(again) == (12 if generator == "eager" else 6)
    rest = [torch.as_tensor(b).reshape(-1).tolist() for b in again]
    assert rest == got[2:]
    assert sorted(i for b in got[:2] + rest for i in b) == list(range(12))


class FeedbackBatches:
    """A batch sampler with no ``batch_size``: each batch is what the loop reported last
    (hard-example mining), so what it yields shows how far ahead it was read."""

    def __init__(self, state, n):
        self.state, self.n = state, n

    def __len__(self):
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            yield [self.state["next"]] * 3


class RandomSizes:
    """Variable-size batches drawn from the global generator (a ``batch_size`` that lies)."""

    batch_size = 3

    def __len__(self):
        return 10

    def __iter__(self):
        for _ in range(10):
            k = int(torch.randint(1, 5, ()).item())
            yield torch.randint(0, 40, (k,)).tolist()


class FailsAt(tud.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == 7:
            raise ValueError("bad sample")
        return i


def _feedback(cls, dataset=None, **kw):
    state, got = {"next": 0}, []
    it = iter(cls(dataset or IndexDataset(40), batch_sampler=FeedbackBatches(state, 10),
                  num_workers=2, **kw))
    k = 0
    while True:
        try:
            b = next(it)
        except StopIteration:
            break
        except ValueError:
            b = None
        got.append(None if b is None else b[0].item())
        k += 1
        state["next"] = k + 5  # sample 7 fails (the batch raises): next() goes on, as in torch
    return got


@pytest.mark.timeout(120)
@pytest.mark.parametrize("in_order", [True, False])
def test_a_user_batch_sampler_is_read_torchs_batches_ahead(in_order, no_leaks):
    """torch reads prefetch_factor x workers batches at iter() and one more per batch it
    delivers or raises; headrace counted samples from a guessed batch size (1 without a
    batch_size attribute), reading another number of batches: other batches than torch's."""
    def same(got, ref):  # out of order: the same batches read, delivered as they finish
        return got == ref if in_order else sorted(got, key=str) == sorted(ref, key=str)

    ref = _feedback(tud.DataLoader)
    assert same(_feedback(hr.DataLoader, in_order=in_order, timeout=60), ref)
    ref = _feedback(tud.DataLoader, FailsAt())
    assert None in ref
    assert same(_feedback(hr.DataLoader, FailsAt(), in_order=in_order, timeout=60), ref)

    def sizes(cls, **kw):
        return lambda n: cls(IndexDataset(n), batch_sampler=RandomSizes(), num_workers=2,
                             prefetch_factor=4, **kw)

    ref = _run(sizes(tud.DataLoader))
    got = _run(sizes(hr.DataLoader, in_order=in_order, timeout=60))
    if in_order:
        assert got == ref
    else:  # the same batches, in the order they finish; the loop's draws untouched
        assert sorted(got[0]) == sorted(ref[0]) and got[1] == ref[1]


class CountedRuns(tud.Dataset):
    """Counts the samples its workers ran (a shared counter the forked workers inherit)."""

    def __init__(self, n, mark):
        ctx = torch.multiprocessing.get_context("fork")
        self.n, self.mark = n, mark
        self.ran, self.marked = ctx.Value("i", 0), ctx.Event()  # set at ``mark`` runs

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.ran.get_lock():
            self.ran.value += 1
            if self.ran.value == self.mark:
                self.marked.set()
        return i


class Chunks:
    """Fixed batches of ``k`` indices, in order, with no ``batch_size`` attribute (a custom
    bucketing sampler)."""

    def __init__(self, n, k):
        self.n, self.k = n, k
        self.read = 0  # batches yielded

    def __len__(self):
        return self.n // self.k

    def __iter__(self):
        for s in range(0, self.n, self.k):
            self.read += 1
            yield list(range(s, s + self.k))


@pytest.mark.timeout(120)
def test_a_batch_sampler_without_batch_size_keeps_torchs_batches_in_flight(no_leaks):
    """Its batches ran one at a time: the samples in flight were bounded from a guessed batch
    size of 1 (2 workers x prefetch 2 = 4 samples), so once the first batch was taken only the
    next was pulled, and the workers idled through every training step. torch keeps
    ``prefetch_factor x workers`` batches in flight past the one delivered."""
    ds, batches = CountedRuns(8 * 32, mark=5 * 32), Chunks(8 * 32, 32)
    it = iter(hr.DataLoader(ds, batch_sampler=batches, num_workers=2, timeout=60))
    got = [next(it).tolist()]
    # the first batch and 4 more ran (a queued sample moved to an idle worker may run twice)
    assert ds.marked.wait(60), f"{ds.ran.value} samples ran"
    assert batches.read == 5  # and the sampler was read no further than torch reads it
    got += [b.tolist() for b in it]
    assert got == [list(range(s, s + 32)) for s in range(0, 8 * 32, 32)]
