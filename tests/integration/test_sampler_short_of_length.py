"""``loader.close()`` with a sampler whose ``__len__`` says more than it yields (an
undersampler: a filtering or class-balancing sampler that reports ``len(dataset)``): torch asks
that length only for ``len(loader)``, so it is a hint, and the epoch ends where the sampler does.

Closed after its last batch, its end not seen yet, ``num_workers=0`` raised
``LoaderClosedError`` saying 8 samples were not delivered (they never existed); with workers,
whose feed had read the sampler's end, the next ``next()`` was a ``StopIteration``. A
``state_dict()`` at its last batch (in the loop, or after ``break``) said ``in_epoch=True``
without workers, and its resume was an empty epoch instead of the next one.
"""

import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from tests.helpers import ArraySource, noise

pytestmark = pytest.mark.integration

N, BS = 16, 4  # the sampler yields the 8 even indices: 2 batches, len(loader) says 4


class Undersampler(tud.Sampler):
    """Every other index; ``__len__`` says ``len(dataset)``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(0, self.n, 2))

    def __len__(self):
        return self.n


def make(workers):
    pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)])
    return hr.DataLoader(pipe, sampler=Undersampler(N), batch_size=BS, num_workers=workers,
                         generator=torch.Generator().manual_seed(5))  # (same content per run)


def indices(batch):
    return [int(v // 1) for v in batch.reshape(len(batch), -1)[:, 0].tolist()]


@pytest.mark.parametrize("workers", [0, 2])
def test_close_after_an_undersamplers_last_batch_ends_cleanly(workers, no_leaks):
    # (num_workers=2 is the reference: its feed read the sampler's end ahead of the batches)
    loader = make(workers)
    it = iter(loader)
    got = indices(next(it)) + indices(next(it))  # every batch; the end not read yet
    assert sorted(got) == list(range(0, N, 2))
    loader.close()
    for _ in range(2):
        with pytest.raises(StopIteration):
            next(it)
    assert not loader.state_dict()["in_epoch"]  # between epochs: nothing is left of it
    assert sorted(i for b in loader for i in indices(b)) == list(range(0, N, 2))
    loader.close()
    # closed before its last batch it still says what was left (reading the sampler at
    # close to find its end must not hide a batch still to come), and resumes the rest
    loader = make(workers)
    it = iter(loader)
    first = indices(next(it))
    loader.close()
    with pytest.raises(hr.LoaderClosedError, match=r"part-way through epoch 0: 1 batch\(es\)"):
        next(it)
    loader.load_state_dict(loader.state_dict())
    rest = [i for b in loader for i in indices(b)]
    assert sorted(first + rest) == list(range(0, N, 2))
    loader.close()


def epochs_of(loader, n):
    return [[b.clone() for b in loader] for _ in range(n)]


def same(a, b):
    return len(a) == len(b) and all(x.equal(y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("leave", ["in the loop", "after break"])
def test_state_at_an_undersamplers_last_batch_loses_and_repeats_nothing(workers, leave,
                                                                        no_leaks):
    # with workers (their feed read the sampler's end) the state is between epochs; without,
    # nothing reads the sampler ahead for a checkpoint (it would change what a sampler drawing
    # from the global generators gives): the state is inside the epoch, whose rest is empty
    reference = make(workers)
    want = epochs_of(reference, 2)
    reference.close()
    loader = make(workers)
    got = []
    for batch in loader:
        got.append(batch.clone())
        if len(got) == len(want[0]):
            if leave == "in the loop":
                state = loader.state_dict()
            break
    if leave == "after break":
        state = loader.state_dict()
    assert same(got, want[0])
    loader.close()
    resumed = make(workers)
    resumed.load_state_dict(state)
    if workers:
        assert not state["in_epoch"] and state["epoch"] == 1
    else:
        assert state["in_epoch"] and state["epoch"] == 0
        assert [b for b in resumed] == []  # the rest of epoch 0: none
    assert same([b.clone() for b in resumed], want[1])
    resumed.close()


class DrawsAsItGoes(Undersampler):
    """The undersampler's order, shuffled as it goes with torch's global generator."""

    def __iter__(self):
        for i in super().__iter__():
            torch.randint(0, 2, ())
            yield i


def test_a_checkpoint_at_every_batch_changes_nothing_a_drawing_sampler_gives(no_leaks):
    # reading the sampler ahead at state_dict() (to tell an undersampler's end) moved its
    # draws before the loop's: with a checkpoint per batch the loop drew other numbers
    def run(checkpoint):
        pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)])
        loader = hr.DataLoader(pipe, sampler=DrawsAsItGoes(N), batch_size=BS, num_workers=0,
                               generator=torch.Generator().manual_seed(5))
        torch.manual_seed(7)
        drawn = []
        for _ in loader:
            if checkpoint:
                loader.state_dict()
            drawn.append(float(torch.rand(())))
        loader.close()
        return drawn

    assert run(True) == run(False)


@pytest.mark.parametrize("workers", [0, 2])
def test_state_inside_an_undersamplers_epoch_still_resumes_its_rest(workers, no_leaks):
    # a state taken part-way, in a new loader: the rest of the epoch, sample for sample, as an
    # uninterrupted run gives it (neither lost nor ended early)
    reference = make(workers)
    want = epochs_of(reference, 1)[0]
    reference.close()
    loader = make(workers)
    it = iter(loader)
    first = next(it).clone()
    state = loader.state_dict()
    assert state["in_epoch"]
    assert same([first] + [b.clone() for b in it], want)
    loader.close()
    resumed = make(workers)
    resumed.load_state_dict(state)
    assert same([b.clone() for b in resumed], want[1:])
    resumed.close()


class Interrupt(BaseException):
    """What a Ctrl-C landing inside the sampler's read does to it (not an ``Exception``)."""


class OverInterrupted(tud.Sampler):
    """Twice its ``__len__`` (an oversampler), interrupted once as its element ``n + BS`` is
    read (a batch past its length: so far, its saved state cannot pass for a whole epoch)."""

    def __init__(self, n):
        self.n, self.interrupted = n, False

    def __iter__(self):
        for i in range(2 * self.n):
            if i == self.n + BS and not self.interrupted:
                self.interrupted = True
                raise Interrupt
            yield i

    def __len__(self):
        return self.n


def test_an_interrupt_while_state_dict_reads_ahead_does_not_end_the_epoch(no_leaks):
    # without workers state_dict() reads an oversampler one group ahead once its deliveries
    # pass its length (its end may be next); interrupted there, the sampler (a generator) is
    # finished, and the next next() ended the epoch with a StopIteration (or the close read
    # the finished generator's end), its rest untold
    pipe = hr.Pipeline(ArraySource(2 * N), [hr.step(noise, random=True)])
    loader = hr.DataLoader(pipe, sampler=OverInterrupted(N), batch_size=BS, num_workers=0,
                           generator=torch.Generator().manual_seed(5))
    it = iter(loader)
    first = [i for _ in range(N // BS + 1) for i in indices(next(it))]
    with pytest.raises(Interrupt):
        loader.state_dict()
    with pytest.raises(RuntimeError, match="the sampler was interrupted while it was read"):
        next(it)
    state = loader.state_dict()
    assert state["in_epoch"]
    loader.close()
    pipe = hr.Pipeline(ArraySource(2 * N), [hr.step(noise, random=True)])
    resumed = hr.DataLoader(pipe, sampler=OverInterrupted(N), batch_size=BS, num_workers=0,
                            generator=torch.Generator().manual_seed(5))
    resumed.sampler.interrupted = True
    resumed.load_state_dict(state)
    assert sorted(first + [i for b in resumed for i in indices(b)]) == list(range(2 * N))
    resumed.close()


class CountingReads(tud.Sampler):
    """The undersampler's indices, each read counted, each drawing from torch's global
    generator as a sampler drawing its order as it goes does."""

    def __init__(self, n):
        self.n, self.reads = n, 0

    def __iter__(self):
        for i in range(0, self.n, 2):
            self.reads += 1
            torch.randint(0, 2, ())
            yield i

    def __len__(self):
        return self.n


@pytest.mark.parametrize("how", ["close", "break"])
def test_leaving_an_epoch_part_way_reads_no_more_of_the_sampler(how, no_leaks):
    # torch reads a sampler only in next(): a close (or the end of a loop left with break)
    # that read one group ahead moved the training loop's later draws from the global
    # generator, and a sampler waiting on the loop blocked the close (a review)
    sampler = CountingReads(N)
    pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)])
    loader = hr.DataLoader(pipe, sampler=sampler, batch_size=BS, num_workers=0,
                           generator=torch.Generator().manual_seed(5))
    it = iter(loader)
    next(it)
    torch.manual_seed(3)
    if how == "close":
        loader.close()
    else:
        del it
    assert sampler.reads == BS  # the first batch's, no more
    assert float(torch.rand(())) == float(torch.manual_seed(3) and torch.rand(()))
    state = loader.state_dict()  # asked for: it may read (the state between epochs or not)
    assert state["in_epoch"]
    if how == "close":
        with pytest.raises(hr.LoaderClosedError):
            next(it)
    loader.close()
