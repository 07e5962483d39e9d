"""Worker info, worker_init_fn, base seed, generator=, random draws in workers."""

import os

import pytest
import torch
import torch.utils.data as tud

from tests.conformance.conftest import PER_SAMPLE_SEEDING, is_headrace
from tests.conformance.datasets import MARK, RandomDraw, WhoRanMe, mark_worker, seed_in_init

pytestmark = pytest.mark.integration


def rows(loader):
    return [tuple(r) for r in loader]


def test_get_worker_info_is_none_in_the_main_process(Loader, no_leaks):
    assert tud.get_worker_info() is None
    got = rows(Loader(WhoRanMe(4), batch_size=None, num_workers=0))
    assert {r[1] for r in got} == {-1}
    assert tud.get_worker_info() is None


def test_worker_info_and_init_fn_in_each_worker(Loader, no_leaks):
    loader = Loader(WhoRanMe(16), batch_size=None, num_workers=2, worker_init_fn=mark_worker)
    got = rows(loader)
    assert sorted(r[0] for r in got) == list(range(16))
    assert {r[1] for r in got} <= {0, 1}
    assert all(r[5] == 1000 + r[1] for r in got)  # worker_init_fn ran in that worker, first
    assert all(r[2] != os.getpid() for r in got)
    assert "mark" not in MARK  # the training process's copy was never initialised


def test_worker_seeds_are_base_seed_plus_id(Loader, no_leaks):
    got = rows(Loader(WhoRanMe(16), batch_size=None, num_workers=2))
    by_worker = {r[1]: r[4] for r in got}
    if len(by_worker) == 2:  # which workers get samples is up to the loader
        assert by_worker[1] - by_worker[0] == 1
    for r in got:
        assert r[4] - r[1] == got[0][4] - got[0][1]  # one base seed per epoch


def test_generator_keyword_fixes_the_worker_seeds(Loader, no_leaks):
    def seeds():
        loader = Loader(WhoRanMe(8), batch_size=None, num_workers=2,
                        generator=torch.Generator().manual_seed(42))
        return {r[4] - r[1] for r in rows(loader)}  # the base seed

    a, b = seeds(), seeds()
    assert len(a) == 1 and a == b


def test_base_seed_changes_between_epochs(Loader, no_leaks):
    loader = Loader(WhoRanMe(4), batch_size=None, num_workers=1,
                    generator=torch.Generator().manual_seed(1))
    first, second = rows(loader)[0][4], rows(loader)[0][4]
    assert first != second


def test_torch_initial_seed_inside_getitem(Loader, no_leaks):
    got = rows(Loader(WhoRanMe(8), batch_size=None, num_workers=2))
    if is_headrace(Loader):  # difference: PER_SAMPLE_SEEDING
        assert len({r[3] for r in got}) == 8, PER_SAMPLE_SEEDING  # one seed per sample
    else:
        assert all(r[3] == r[4] for r in got)  # torch: the worker's seed, set once


def test_manual_seed_in_worker_init_fn(Loader, no_leaks):
    """torch's own test_worker_init_fn: a seed fixed in worker_init_fn reaches __getitem__."""
    got = [r[3] for r in rows(Loader(WhoRanMe(4), batch_size=None, num_workers=2,
                                     worker_init_fn=seed_in_init))]
    if is_headrace(Loader):  # difference: PER_SAMPLE_SEEDING re-seeds before each sample
        assert 12345 not in got
    else:
        assert got == [12345] * 4


def test_headrace_warns_when_worker_init_fn_seeds_are_overridden(no_leaks):
    """The difference above would silently change results: headrace says so, once."""
    import headrace as hr

    with pytest.warns(UserWarning, match="worker_init_fn"):
        list(hr.DataLoader(WhoRanMe(4), batch_size=None, num_workers=2,
                           worker_init_fn=seed_in_init))


def test_random_draws_depend_on_workers_in_torch_not_in_headrace(Loader, no_leaks):
    def draws(workers):
        loader = Loader(RandomDraw(), batch_size=None, num_workers=workers, in_order=True,
                        generator=torch.Generator().manual_seed(7))
        return list(loader)

    one, two = draws(1), draws(2)
    if is_headrace(Loader):  # difference: PER_SAMPLE_SEEDING (a sample's content is its own)
        assert one == two
        assert draws(0) == one
    else:
        assert one != two
    assert len(set(one)) == 12 and len(set(two)) == 12


def test_random_draws_with_zero_workers_do_not_leak_into_the_training_loop(Loader):
    torch.manual_seed(3)
    list(Loader(RandomDraw(), batch_size=4))
    after = torch.rand(())
    torch.manual_seed(3)
    torch.empty((), dtype=torch.int64).random_()  # the base seed both loaders draw
    if is_headrace(Loader):  # PER_SAMPLE_SEEDING: the global state is saved and restored
        assert torch.equal(after, torch.rand(()))
    else:  # torch: the dataset drew from the training loop's generator
        assert not torch.equal(after, torch.rand(()))
