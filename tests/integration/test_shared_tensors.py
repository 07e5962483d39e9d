"""A worker process sends its samples' tensors without handing its own memory over
(runtime/transport.py). Tensors that missed the ring (every bfloat16 one, a leaf over a quarter
of the ring) were given to torch's pickling as they were, which moves the worker's own storage
to shared memory in place: the training process then read a buffer the worker was already
filling with its next sample (rows holding other samples, torn rows), and every preloaded
sample sent stayed a shared-memory segment and a file descriptor for the worker's life.
Small leaves were pickled when their message was sent, also after the worker filled them again.
"""

import pytest
import torch

from headrace.runtime import DataLoader, ring

pytestmark = pytest.mark.integration


class Reused(torch.utils.data.Dataset):
    """Fills one buffer for every index and returns it (a decoder with an output buffer):
    torch's workers collate at once, so each batch row is its own sample there."""

    def __init__(self, n: int, numel: int, dtype: torch.dtype, as_numpy: bool = False,
                 parameter: bool = False) -> None:
        self.n, self.numel, self.dtype, self.as_numpy = n, numel, dtype, as_numpy
        self.parameter = parameter
        self.buf: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.buf is None:
            self.buf = torch.empty(self.numel, dtype=self.dtype)
        self.buf.fill_(i % 200)  # exact in bfloat16
        if self.parameter:  # a tensor subclass, sharing the buffer's storage
            return torch.nn.Parameter(self.buf, requires_grad=False)
        return self.buf.numpy() if self.as_numpy else self.buf


def _rows_not_their_own(loader) -> list[tuple[int, float, float]]:
    bad, i = [], 0
    for batch in loader:
        assert batch.dtype == loader.dataset.dtype
        for row in batch:
            lo, hi = float(row.min()), float(row.max())
            if lo != i % 200 or hi != i % 200:
                bad.append((i, lo, hi))
            i += 1
    assert i == len(loader.dataset)
    return bad


@pytest.mark.parametrize("numel, dtype, kind", [
    (256, torch.bfloat16, "tensor"),       # inline (no NumPy dtype: it went to torch's path)
    (1 << 20, torch.bfloat16, "tensor"),   # 2 MB: over the inline limit
    (64, torch.float32, "tensor"),         # under the ring's smallest leaf: pickled inline
    (64, torch.float32, "numpy"),
    (1 << 10, torch.float32, "parameter"),  # a subclass: pickled by torch
])
def test_a_reused_buffer_gives_each_row_its_own_sample(numel, dtype, kind, no_leaks):
    dataset = Reused(512, numel, dtype, kind == "numpy", kind == "parameter")
    loader = DataLoader(dataset, batch_size=8, num_workers=2,
                        multiprocessing_context="fork", timeout=120)
    assert _rows_not_their_own(loader) == []


def test_a_reused_numpy_buffer_over_a_quarter_of_the_ring_gives_each_row_its_own_sample(
        no_leaks):
    # a 4.5 MiB NumPy sample misses the 16 MiB rings of spawned workers: it crossed as a
    # tensor over the worker's own buffer until its message was pickled, and the dataset had
    # filled the buffer again meanwhile (21-28 of 200 rows another sample's: a review; with
    # 120 samples it did not show)
    loader = DataLoader(Reused(200, 9 << 17, torch.float32, as_numpy=True), batch_size=1,
                        num_workers=2, multiprocessing_context="spawn", timeout=120)
    assert _rows_not_their_own(loader) == []


def test_a_reused_buffer_over_a_quarter_of_the_ring_gives_each_row_its_own_sample(
        monkeypatch, no_leaks):
    # a 1.5 MB float32 sample with 1 MB rings (set in the training process, which makes them):
    # over a quarter of the ring and the inline limit, so it takes torch's shared memory
    monkeypatch.setattr(ring, "RING_BYTES", 1 << 20)
    loader = DataLoader(Reused(32, 3 << 17, torch.float32), batch_size=4, num_workers=2,
                        multiprocessing_context="spawn", timeout=120)
    assert _rows_not_their_own(loader) == []


class Preloaded(torch.utils.data.Dataset):
    """Samples held in memory (precomputed embeddings); each sample also says how many of the
    worker's preloaded tensors have their storage in shared memory by now."""

    def __init__(self, n: int) -> None:
        self.data = [torch.full((4096,), i % 200, dtype=torch.bfloat16) for i in range(n)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return self.data[i], sum(t.untyped_storage().is_shared() for t in self.data)


def test_preloaded_samples_stay_the_workers_private_memory(no_leaks):
    loader = DataLoader(Preloaded(600), batch_size=50, num_workers=2,
                        multiprocessing_context="fork", persistent_workers=True, timeout=120)
    try:
        for _ in range(2):
            shared = [int(n) for _, counts in loader for n in counts]
            assert len(shared) == 600
            assert max(shared) == 0, f"up to {max(shared)} preloaded storages made shared"
    finally:
        loader.close()
