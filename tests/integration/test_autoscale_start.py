"""``num_workers="auto"`` with a stored profile: the first epoch starts at the workers that keep
the cores busy (``AutoscaleConfig.start_count``), within the memory budget."""

import time

import pytest
import torch
from torch.utils.data import Dataset

import headrace as hr
from headrace.planner.workers import AutoscaleConfig, busy_workers, rank_cpus
from headrace.profiler.report import cpu_share
from headrace.profiler.store import ProfileStore
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration


class SpinDataset(Dataset):
    """CPU-bound samples: each spins for ``spin_s`` of its thread's CPU time (simulated work)."""

    def __init__(self, spin_s: float = 0.003) -> None:
        self.spin_s = spin_s

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.thread_time() + self.spin_s
        while time.thread_time() < end:
            pass
        return torch.tensor(i)


def first_pool_size(store, dataset=None, **autoscale) -> int:
    """Workers the first epoch's pool started with (a loader with a profile in ``store``)."""
    opts = hr.Options(cache=None, profile_store=store,
                      autoscale=AutoscaleConfig(max_workers=6, **autoscale))
    dataset = dataset if dataset is not None else IndexDataset(48, slow_every=1, slow_s=0.01)
    loader = hr.DataLoader(dataset, batch_size=4, num_workers="auto", options=opts)
    try:
        assert sorted(i for b in loader for i in b.tolist()) == list(range(48))
        return loader.monitor.workers_timeline[0][1]
    finally:
        loader.close()


def test_a_stored_profile_starts_the_first_epoch_where_the_cores_stay_busy(tmp_path):
    store = tmp_path / "profiles.sqlite"
    cold = first_pool_size(store)  # no profile yet: the cores (at most 2 on CI machines)
    assert cold == AutoscaleConfig().start_count()
    # samples sleep 10 ms and use little CPU: cores / CPU share is far above the bound of 6
    assert first_pool_size(store) == 6
    # a memory budget smaller than the training process: no more than the cold start
    assert first_pool_size(store, memory_budget_bytes=1) == cold


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # torch's, for cores + 1
def test_cpu_bound_samples_start_at_the_cores_however_busy_their_profile_was(tmp_path):
    """A profile measured with more workers than cores has steps that waited for a core;
    that wait is not counted as the samples' own (``profiler/runqueue.py``), so the next job
    starts at the cores instead of one more worker than they can run."""
    store = tmp_path / "profiles.sqlite"
    cores = rank_cpus()
    loader = hr.DataLoader(SpinDataset(), batch_size=4, num_workers=cores + 1,
                           options=hr.Options(cache=None, profile_store=store))
    try:
        assert sorted(i for b in loader for i in b.tolist()) == list(range(48))
    finally:
        loader.close()
    assert first_pool_size(store, SpinDataset()) == min(cores, 6)


def test_a_profile_measured_on_threads_does_not_size_a_process_pool(tmp_path):
    """Worker threads spinning on the GIL read as samples that mostly wait (their GIL waits
    are wall time, not CPU nor run queue); a process pool sized from that profile started at
    cores / share workers (52 on 16 cores, measured). The profile says which executor measured
    it, and a process run starts from the cores instead."""
    store = tmp_path / "profiles.sqlite"
    cores = rank_cpus()
    # samples longer than CPython's 5 ms switch interval, so each is made to give the GIL up
    # midway to the other threads and its wall time counts their turns; at 3 ms a thread
    # could run a whole sample on one turn (handing over between samples), and runs read a
    # CPU share of 0.84-0.98 where this test needs the waits
    loader = hr.DataLoader(SpinDataset(0.012), batch_size=4, num_workers=6,
                           options=hr.Options(cache=None, profile_store=store,
                                              executor="threads"))
    try:
        assert sorted(i for b in loader for i in b.tolist()) == list(range(48))
        threads = loader.monitor.profiler.report()
    finally:
        loader.close()
    assert threads.executor == "threads"
    assert busy_workers(cores, cpu_share(threads.steps)) > cores  # what sized processes before
    assert first_pool_size(store, SpinDataset()) == min(cores, 6)
    # each executor keeps its own profile of the job: the threads one is still there
    stored = ProfileStore(store).keys()
    assert {k.executor for k in stored} == {"threads", "processes"}


def test_a_slow_consumer_stored_with_the_profile_starts_fewer_workers(tmp_path):
    """The profile keeps the rate at which the training loop took samples; the next run starts
    at the workers Little's law gives for it, not at what the cores could run: samples that
    sleep 10 ms for a loop that takes 40 samples a second need one worker. The loop's rate is
    what the epoch measured (``Monitor.last_consumer_rate``, unit-tested on its numbers); here
    it is set, so no test loop has to be slow on the clock."""
    store = tmp_path / "profiles.sqlite"
    opts = hr.Options(cache=None, profile_store=store, autoscale=AutoscaleConfig(max_workers=6))
    loader = hr.DataLoader(IndexDataset(48, slow_every=1, slow_s=0.01), batch_size=4,
                           num_workers="auto", options=opts)
    loader.monitor.last_consumer_rate = lambda: 40.0  # a loop taking 4 samples every 0.1 s
    try:
        for b in loader:
            assert len(b) == 4
    finally:
        loader.close()
    assert ProfileStore(store).get(loader.planning.key).consumer_rate == 40.0
    loader = hr.DataLoader(IndexDataset(48, slow_every=1, slow_s=0.01), batch_size=4,
                           num_workers="auto", options=opts)
    try:
        assert sorted(i for b in loader for i in b.tolist()) == list(range(48))
        assert loader.monitor.workers_timeline[0][1] == 1
        assert "started at 1 from a stored profile" in loader.explain()
        assert "keep fed (λ·W)" in loader.explain()
    finally:
        loader.close()
    # that run's loop took no time to measure: the stored rate is kept, not forgotten
    assert first_pool_size(store) == 1


def test_samples_of_microseconds_start_where_nothing_was_stored(tmp_path):
    # a dataset returning its index: the profiler's clock reads made its CPU share 0.04-0.23,
    # and the next run started up to 32 worker processes on 2 cores; explain() said the
    # count was "auto as given (never changed by headrace)"
    store = tmp_path / "profiles.sqlite"
    cold = first_pool_size(store, IndexDataset(48))
    assert first_pool_size(store, IndexDataset(48)) == cold
    loader = hr.DataLoader(IndexDataset(48), batch_size=4, num_workers="auto",
                           options=hr.Options(cache=None, profile_store=store))
    try:
        list(loader)
        text = loader.explain()
    finally:
        loader.close()
    assert 'num_workers="auto", not adapted since the start' in text
    ran = [n for _, n in loader.stats().workers_timeline if n]
    assert ran and f"({ran[-1]} ran;" in text  # how many it ran
    assert "as given" not in text


def test_no_more_workers_start_than_the_epoch_has_samples(tmp_path):
    # samples that mostly wait: the stored profile asks for cores / share workers (16 per core
    # at most); a 16-sample epoch started them all (32 on 2 cores: an edge-case hunt's 16-sample
    # job ran its epochs 7-9x longer than with 2 workers)
    store = tmp_path / "profiles.sqlite"
    opts = hr.Options(cache=None, profile_store=store)
    sizes = []
    for _ in range(2):
        loader = hr.DataLoader(IndexDataset(16, slow_every=1, slow_s=0.01), batch_size=8,
                               num_workers="auto", options=opts)
        try:
            assert sorted(i for b in loader for i in b.tolist()) == list(range(16))
            sizes.append(max(n for _, n in loader.monitor.workers_timeline))
        finally:
            loader.close()
    assert sizes[1] <= 8, sizes  # (two samples a worker)
