"""Worker threads (``Options(executor="threads")``): the invariants hold as with processes."""

import gc
import logging
import threading
import time
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

import headrace as hr
from tests.helpers import ArraySource, FailingDataset, IndexDataset, WorkerInfoDataset, noise

pytestmark = pytest.mark.integration

THREADS = hr.Options(executor="threads")


def flat(loader):
    return [i for b in loader for i in b.tolist()]


@pytest.mark.parametrize("in_order", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_each_index_exactly_once(in_order, drop_last, shuffle, no_leaks):
    ds = IndexDataset(41, slow_every=7, slow_s=0.01)  # uneven costs reorder completions
    torch.manual_seed(3)
    expected = Counter(flat(torch.utils.data.DataLoader(ds, batch_size=6, shuffle=shuffle,
                                                        drop_last=drop_last)))
    torch.manual_seed(3)
    loader = hr.DataLoader(ds, batch_size=6, shuffle=shuffle, drop_last=drop_last, num_workers=3,
                           in_order=in_order, options=THREADS)
    assert Counter(flat(loader)) == expected


def test_same_batches_as_worker_processes(no_leaks):
    # noise draws from the step's rng: the content depends on (seed, epoch, index) only
    pipe = hr.Pipeline(ArraySource(30), [hr.step(noise, name="noise", random=True)])

    def batches(executor):
        opts = hr.Options(seed=7, executor=executor)
        loader = hr.DataLoader(pipe, batch_size=5, shuffle=True, num_workers=2, in_order=True,
                               options=opts)
        return [b for _ in range(2) for b in loader]  # two epochs: different draws

    procs, threads = batches("processes"), batches("threads")
    assert len(procs) == len(threads) == 12
    for a, b in zip(procs, threads, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(procs[0], procs[6])  # epoch 1 draws differ from epoch 0


def test_failing_step_raises_with_index_step_and_traceback(no_leaks):
    loader = hr.DataLoader(FailingDataset(20, {13}), batch_size=4, num_workers=2, options=THREADS)
    with pytest.raises(hr.StepError) as ei:
        list(loader)
    e = ei.value
    assert isinstance(e, ValueError)
    assert e.index == 13 and e.step == "load"
    assert "corrupt sample 13" in str(e) and "__getitem__" in e.remote_traceback


def test_skip_policy_drops_and_counts_failing_samples(no_leaks):
    opts = hr.Options(on_error="skip", executor="threads")
    loader = hr.DataLoader(FailingDataset(20, {3, 13}), batch_size=4, num_workers=2, options=opts)
    assert sorted(flat(loader)) == sorted(set(range(20)) - {3, 13})
    assert loader.stats().last.skipped_samples == 2


def test_break_and_del_stop_the_threads(no_leaks):
    loader = hr.DataLoader(IndexDataset(200, slow_every=1, slow_s=0.005), batch_size=4,
                           num_workers=3, options=THREADS)
    for i, _ in enumerate(loader):
        if i == 2:
            break
    gc.collect()
    persistent = hr.DataLoader(IndexDataset(20), batch_size=4, num_workers=2,
                               persistent_workers=True, options=THREADS)
    assert [sorted(flat(persistent)) for _ in range(2)] == [list(range(20))] * 2
    assert sum(t.name.startswith("headrace-worker") for t in threading.enumerate()) == 2
    # between epochs no scheduler takes results: a late one waits in the thread's queue
    assert all(w.conn.sink is None for w in persistent._pool.workers.values())
    del persistent  # no_leaks checks that no worker thread is left


def test_autoscaled_threads_deliver_exactly_once(no_leaks):
    ds = IndexDataset(120, slow_every=3, slow_s=0.005)
    opts = hr.Options(autoscale=hr.AutoscaleConfig(initial=1, max_workers=3, interval_s=0.05),
                      executor="threads")
    loader = hr.DataLoader(ds, batch_size=8, shuffle=True, num_workers="auto", options=opts)
    assert Counter(flat(loader)) == Counter(range(120))


def test_worker_info_is_none_in_a_thread(no_leaks):
    loader = hr.DataLoader(WorkerInfoDataset(), batch_size=4, num_workers=2,
                           collate_fn=lambda b: b, options=THREADS)
    rows = [r for b in loader for r in b]
    assert sorted(r[0] for r in rows) == list(range(16))
    assert {r[1] for r in rows} == {-1}  # as torch's get_worker_info() outside a worker process


def test_options_that_need_processes_are_refused():
    with pytest.raises(ValueError, match="sample_timeout_s"):
        hr.Options(executor="threads", sample_timeout_s=1.0)
    with pytest.raises(ValueError, match="executor"):
        hr.Options(executor="fibers")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="worker_init_fn"):
        hr.DataLoader(IndexDataset(4), num_workers=2, worker_init_fn=print, options=THREADS)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(ValueError, match="IterableDataset"):
        hr.DataLoader(Stream(), num_workers=2, options=THREADS)
    # no workers, nothing to refuse: the loop runs in the training thread as with torch
    assert flat(hr.DataLoader(IndexDataset(4), num_workers=0, worker_init_fn=print,
                              options=THREADS)) == [0, 1, 2, 3]


class Gated(torch.utils.data.Dataset):
    """``ds[i] == i``; indices from ``first`` on wait until ``gate`` is set."""

    def __init__(self, n: int, first: int) -> None:
        self.n, self.first = n, first
        self.gate = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i >= self.first:
            assert self.gate.wait(30), "the test never opened the gate"
        return i


def test_an_epoch_finalised_inside_a_worker_thread_shuts_down(no_leaks, caplog):
    # The last reference to an epoch can die in a worker thread (the garbage collector runs
    # wherever an allocation triggers it) while that thread hands a result to the scheduler
    # under its lock. Here a sample listener, which runs right there, drops it: closing the
    # epoch must not deadlock on that lock or join the thread it runs in, and abandoning the
    # other worker threads (they exit on their own) is no cause for a warning.
    ds = Gated(64, first=4)
    loader = hr.DataLoader(ds, batch_size=4, num_workers=2, options=THREADS)
    holder: list = []
    closed_in: list[str] = []
    dropped = threading.Event()

    def drop(index, seconds, slow):
        if ds.gate.is_set() and holder:
            closed_in.append(threading.current_thread().name)
            holder.clear()  # the epoch's last reference: it is closed in this call
            dropped.set()

    loader.add_sample_listener(drop)
    holder.append(iter(loader))
    try:  # only these can finish before the gate opens (in the order they finish)
        assert sorted(next(holder[0]).tolist()) == [0, 1, 2, 3]
    finally:
        ds.gate.set()
    assert dropped.wait(30)
    assert closed_in[0].startswith("headrace-worker")
    for t in threading.enumerate():
        if t.name.startswith("headrace-worker"):
            t.join(10)
            assert not t.is_alive(), f"{t.name} did not end"
    warned = [r.getMessage() for r in caplog.records
              if r.name == "headrace" and r.levelno >= logging.WARNING]
    assert not warned  # neither "abandoned" threads nor a worker "died"


class FailingSampler(torch.utils.data.Sampler):
    """Yields 0, 1, ... and raises once ``fail_at`` indices were drawn."""

    def __init__(self, n: int, fail_at: int) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for i in range(self.n):
            if i == self.fail_at:
                raise LookupError(f"sampler broke at {i}")
            yield i


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_a_sampler_that_raises_mid_epoch_reaches_the_training_loop(executor, no_leaks):
    # The sampler is drawn from wherever work is dispatched: the scheduler thread, a worker
    # thread handing in its result, or (threads) the training loop taking a batch.
    loader = hr.DataLoader(IndexDataset(40), batch_size=2, sampler=FailingSampler(40, 17),
                           num_workers=2, options=hr.Options(executor=executor))
    seen = []
    with pytest.raises(LookupError, match="sampler broke at 17"):
        for b in loader:
            seen += b.tolist()
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(17))


def draws_globally(x):
    return x + torch.rand(1).item()  # torch's global generator: shared by worker threads


def test_a_step_drawing_from_the_global_generators_is_warned_about_at_the_users_line(no_leaks):
    pipe = hr.Pipeline(ArraySource(40), [hr.step(draws_globally, name="draws_globally_t")])
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, options=THREADS)
    with pytest.warns(UserWarning, match="while step 'draws_globally_t' ran in a worker") as rec:
        assert len(flat(loader)) == 40
    said = [w for w in rec if "draws_globally_t" in str(w.message)]
    assert len(said) == 1 and said[0].filename == __file__  # the loop's line, once
    # the load beside it saw the shared generators change at times (the other thread's
    # draws): not named, as it did not change them on most of its runs
    assert not [w for w in rec if "the source's load" in str(w.message)]
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        flat(loader)
    assert not [w for w in again if "draws_globally_t" in str(w.message)]


def test_steps_of_one_name_in_two_pipelines_are_each_warned_about(no_leaks):
    # The warning used to be said once per step name: a second pipeline's <lambda> drawing
    # from a global generator (a validation loader's, say) was never named.
    first = hr.step(lambda x: x + torch.rand(1).item())
    second = hr.step(lambda x: x + np.float32(np.random.rand()))
    assert first.name == second.name
    said = []
    for step in (first, second):
        loader = hr.DataLoader(hr.Pipeline(ArraySource(40), [step]), batch_size=4,
                               num_workers=2, options=THREADS)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            assert len(flat(loader)) == 40
        said.append([str(w.message) for w in rec if "global random generator" in str(w.message)])
    assert [len(s) for s in said] == [1, 1], said
    for step, (message,) in zip((first, second), said, strict=True):
        code = step.fn.__code__  # the message tells the two apart by where each is defined
        assert "step '<lambda>' ran" in message
        assert f"{code.co_filename}:{code.co_firstlineno}" in message


class SleepyIndices(torch.utils.data.Dataset):
    """``tensor([i] * 4)`` after 10 ms of simulated decoding (the GIL let go): draws nothing."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.01)  # simulated work that lets go of the GIL, as decoding does
        return torch.full((4,), float(i))


def test_a_training_loop_drawing_from_torchs_generator_does_not_blame_the_dataset(no_leaks):
    # Dropout on CPU in the loop draws from torch's global generator while worker threads run
    # the dataset's load: a rule that took two changes on runs with no other worker thread in
    # a step as the load's own draws warned in 5 of 5 runs, naming a dataset that draws nothing
    # (a review); the warning needs most of the watched runs to change the generators.
    loader = hr.DataLoader(SleepyIndices(), batch_size=8, num_workers=4, options=THREADS)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        n = 0
        for b in loader:
            n += len(b)
            torch.nn.functional.dropout(torch.ones(64, 64), 0.5, training=True)
            time.sleep(0.005)  # simulated work: the training step
    loader.close()
    assert n == 256
    said = [str(w.message) for w in rec if "global random generator" in str(w.message)]
    assert said == [], said
