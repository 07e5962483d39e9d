"""A collate_fn that draws random numbers (masking, mixup) gives the same batches run after run
and leaves the training loop's draws alone, as torch's workers do (runtime/collate_rng.py)."""

import hashlib
import random
import threading

import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from headrace.runtime.collate_rng import PROBE_BATCHES
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration


def mask(batch):
    """Masks 15% of a batch's entries from the global torch generator, as a language-modelling
    collator does."""
    x = torch.stack([torch.full((8,), float(i)) for i in batch])
    return x.masked_fill(torch.rand(x.shape) < 0.15, -1.0)


def run(loader_cls, **kw):
    """(hash of the batches, hash of the training loop's dropout masks) of a seeded epoch."""
    torch.manual_seed(0)
    loader = loader_cls(IndexDataset(64), batch_size=8, shuffle=True, collate_fn=mask,
                        generator=torch.Generator().manual_seed(1), **kw)
    batches, loop = hashlib.md5(), hashlib.md5()
    try:
        for b in loader:
            batches.update(b.numpy().tobytes())
            loop.update(torch.nn.functional.dropout(torch.ones(16), 0.5).numpy().tobytes())
        return batches.hexdigest(), loop.hexdigest(), loader
    finally:
        getattr(loader, "close", lambda: None)()


def test_a_random_collate_fn_is_reproducible_and_leaves_the_loops_draws_alone(no_leaks):
    first, loop, loader = run(hr.DataLoader, num_workers=2, in_order=True)
    again, loop_again, _ = run(hr.DataLoader, num_workers=2, in_order=True)
    assert (first, loop) == (again, loop_again)
    _, torch_loop, _ = run(tud.DataLoader, num_workers=2)  # torch's workers draw apart
    assert loop == torch_loop
    assert "seeded per batch" in loader.explain()


def test_a_collate_fn_that_draws_nothing_moves_to_the_collate_thread(no_leaks):
    threads = []

    def plain(batch):
        threads.append(threading.current_thread().name)
        return torch.tensor(batch)

    loader = hr.DataLoader(IndexDataset(80), batch_size=4, num_workers=2, collate_fn=plain,
                           in_order=True)
    try:
        assert [b.tolist() for b in loader] == [list(range(i, i + 4)) for i in range(0, 80, 4)]
        # the watched batches in the loop; those queued before the decision too, which the
        # loop may take after the collate thread began on later ones (never both at once)
        main = threading.current_thread().name
        in_loop = threads.count(main)
        assert PROBE_BATCHES <= in_loop < len(threads)
        assert threads[:PROBE_BATCHES] == [main] * PROBE_BATCHES
        last = len(threads) - threads[::-1].index(main)
        assert all(t.startswith("headrace-collate") for t in threads[last:])
        assert all(t == main or t.startswith("headrace-collate") for t in threads)
        assert "drew no random number" in loader.explain()
    finally:
        loader.close()


class DrawingSampler(tud.Sampler):
    """Draws each index from Python's global generator as the scheduler thread asks for it,
    recording the generator's state before each draw."""

    def __init__(self, n):
        self.n, self.states = n, []

    def __len__(self):
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            self.states.append(random.getstate())
            yield random.randrange(self.n)


def tensor_of(batch):
    """Draws nothing (the mutual exclusion itself: tests/unit/test_collate_rng.py)."""
    return torch.tensor(batch)


def test_a_sampler_drawing_from_the_globals_is_never_rewound_by_a_seeded_collate(no_leaks):
    # a sampler's draws made while a collate_fn ran seeded were rewound with it (the same
    # values again), and made a collate_fn that drew nothing look as if it had
    random.seed(0)
    sampler = DrawingSampler(400)
    loader = hr.DataLoader(IndexDataset(400), batch_size=4, sampler=sampler, num_workers=2,
                           collate_fn=tensor_of)
    try:
        assert sum(len(b) for b in loader) == 400
        assert "drew no random number" in loader.explain()
    finally:
        loader.close()
    assert len({hash(s) for s in sampler.states}) == len(sampler.states) == 400


def np_mask(batch):
    """Masks from NumPy's global generator (whatever bit generator the user gave it)."""
    import numpy as np

    x = torch.stack([torch.full((8,), float(i)) for i in batch])
    return x.masked_fill(torch.from_numpy(np.random.rand(*x.shape) < 0.15), -1.0)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_users_own_global_numpy_bit_generator_is_kept_and_batches_repeat(workers, no_leaks):
    # np.random.set_bit_generator (NumPy >= 1.25): np.random.get_state() is a dict there, which
    # the collate probe once indexed as the Mersenne Twister's tuple (TypeError at the first batch)
    import numpy as np

    before = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(5))
    try:
        runs = []
        for _ in range(2):
            loader = hr.DataLoader(IndexDataset(32), batch_size=8, shuffle=True, collate_fn=np_mask,
                                   num_workers=workers, generator=torch.Generator().manual_seed(1),
                                   in_order=True)
            runs.append([b.numpy().tobytes() for b in loader])
            loader.close()
        assert all(len(r) == 4 for r in runs)
        if workers:  # seeded per batch, as with the Mersenne Twister (in the training process,
            assert runs[0] == runs[1]  # num_workers=0, it draws from them as torch's does)
        assert np.random.get_bit_generator().state["bit_generator"] == "PCG64"  # still the user's
    finally:
        np.random.set_bit_generator(before)
