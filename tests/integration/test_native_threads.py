"""Worker processes run NumPy's OpenBLAS with one thread by default (``worker_blas_threads``),
libraries they load later too; the training process is left as it is."""

import os

import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from headrace.runtime.native_threads import blas_limited, blas_threads

pytestmark = pytest.mark.integration


class ThreadReport(tud.Dataset):
    """Each sample: the OpenBLAS thread counts and OPENBLAS_NUM_THREADS seen where it runs."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        counts = sorted(set(blas_threads().values()))
        env = int(os.environ.get("OPENBLAS_NUM_THREADS", "0"))
        return torch.tensor([len(counts), counts[0] if counts else 0, env])


def seen(**options) -> set[tuple[int, int, int]]:
    loader = hr.DataLoader(ThreadReport(), batch_size=2, num_workers=2,
                           options=hr.Options(cache=None, profile_store=False, **options))
    try:
        return {tuple(row.tolist()) for b in loader for row in b}
    finally:
        loader.close()


@pytest.fixture
def two_blas_threads():
    # NumPy's wheels (the ones `make test` installs) ship OpenBLAS: none found means the
    # lookup of loaded libraries is broken, which is what this file tests
    assert blas_threads(), "no OpenBLAS found among this process's libraries"
    env = os.environ.get("OPENBLAS_NUM_THREADS")
    with blas_limited(2) as counts:
        assert set(counts.values()) == {2}
        yield
    assert os.environ.get("OPENBLAS_NUM_THREADS") == env  # the training process's env unchanged


def test_workers_run_one_blas_thread_by_default(two_blas_threads):
    assert seen() == {(1, 1, 1)}  # one library, 1 thread, and 1 for libraries loaded later
    assert set(blas_threads().values()) == {2}  # the training process keeps its 2


def test_none_leaves_the_workers_as_inherited(two_blas_threads):
    env = int(os.environ.get("OPENBLAS_NUM_THREADS", "0"))
    assert seen(worker_blas_threads=None) == {(1, 2, env)}


def test_worker_blas_threads_is_checked():
    with pytest.raises(ValueError, match="worker_blas_threads"):
        hr.Options(worker_blas_threads=0)
