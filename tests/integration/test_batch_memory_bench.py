"""python -m headrace.bench.batch_memory: every row runs and delivers every sample, and the
NumPy row leaves the pool's allocator as it found it."""

import pytest

from headrace.bench import batch_memory
from headrace.bench.config import quick_config
from headrace.runtime.pinning import PageableMemory

pytestmark = pytest.mark.integration


def test_batch_memory_bench_runs_every_row_and_restores_the_allocator():
    own = PageableMemory.allocate
    res = batch_memory.run(["imagenet"], 1, quick_config(["imagenet"], num_samples=48))
    assert PageableMemory.allocate is own
    assert set(res) == {"imagenet"} and set(res["imagenet"]) == set(batch_memory.ROWS)
    assert all(len(v) == 1 and v[0][0] > 0 and v[0][1] >= 0 for v in res["imagenet"].values())
    text = batch_memory.markdown(res)
    assert text.count("| imagenet |") == 3 and "1.00x" in text


def test_the_later_epochs_mode_runs_both_rows_and_restores_the_pools_memory():
    own = PageableMemory.allocate, PageableMemory.set_idle
    res = batch_memory.later_epochs(["imagenet"], 1, 2, quick_config(["imagenet"], num_samples=48))
    assert (PageableMemory.allocate, PageableMemory.set_idle) == own
    assert set(res["imagenet"]) == set(batch_memory.EPOCH_ROWS)
    assert all(len(v) == 1 and v[0][0] > 0 for v in res["imagenet"].values())
