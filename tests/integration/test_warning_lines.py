"""headrace's warnings name the user's line (not one inside headrace, whatever the depth it
warns at), say what is the case, and are not repeated epoch after epoch; a timeout's error is
not chained to the empty queue it waited on."""

import multiprocessing as mp
import random
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import headrace as hr
from tests.helpers import FailingDataset

pytestmark = pytest.mark.integration


class Values(tud.Dataset):
    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(np.random.rand())])


class Stream(tud.IterableDataset):
    def __iter__(self):
        return iter(torch.arange(16.0).view(-1, 1))


def _said(caught, text: str):
    return [w for w in caught if text in str(w.message)]


def seed_worker(worker_id: int) -> None:
    """torch's documented recipe ("Randomness in multi-process data loading")."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


@pytest.mark.parametrize("generator", [True, False])
def test_the_worker_init_fn_warning_is_at_the_loop_and_says_what_is_the_case(generator,
                                                                            no_leaks):
    # torch's recipe with generator=g was told to pass generator= (it had), from the
    # scheduler thread's line in headrace/runtime/scheduler.py
    g = torch.Generator().manual_seed(0) if generator else None
    loader = hr.DataLoader(Values(), batch_size=4, num_workers=2, worker_init_fn=seed_worker,
                           generator=g)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for _ in loader:
                pass
    loader.close()
    told = _said(caught, "worker_init_fn seeded")
    assert len(told) == 1 and told[0].filename == __file__, [
        (w.filename, w.lineno) for w in told]
    text = str(told[0].message)
    assert "the global generators of random and numpy" in text
    if generator:
        assert "reproducible already" in text and "DataLoader(generator=" not in text
    else:
        assert "torch.manual_seed()" in text and "DataLoader(generator=...)" in text


@pytest.mark.parametrize("workers", [0, 2])
def test_an_empty_epoch_is_warned_of_once_per_loader_at_the_loop(workers, no_leaks):
    # its text names the epoch, so Python's default filter said it every epoch; and it named
    # headrace/runtime/monitor.py as the line
    loader = hr.DataLoader(FailingDataset(4, set(range(4))), batch_size=2, num_workers=workers,
                           options=hr.Options(on_error="skip"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert list(loader) == []
    loader.close()
    told = _said(caught, "delivered no batch")
    assert len(told) == 1 and told[0].filename == __file__, [
        (w.filename, w.lineno, str(w.message)[:40]) for w in told]
    assert "epoch 0 delivered no batch" in str(told[0].message)
    assert [(e.samples, e.skipped_samples) for e in loader.stats().epochs] == [(0, 4)] * 3


def _state_after_a_batch(loader: hr.DataLoader) -> dict:
    """``loader``'s state dict after its first batch, its iterator left; the loader closed."""
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    loader.close()
    return state


def test_a_resume_with_other_settings_is_said_at_load_state_dict_as_such(no_leaks):
    # it named headrace/runtime/loader.py, and said "saved by other code" of a batch_size
    state = _state_after_a_batch(hr.DataLoader(Values(), batch_size=4))
    second = hr.DataLoader(Values(), batch_size=8)
    with pytest.warns(UserWarning, match="saved with other settings") as caught:
        second.load_state_dict(state)
    told = _said(caught, "resuming a state dict")
    assert len(told) == 1 and told[0].filename == __file__
    assert "other code" not in str(told[0].message)
    second.close()


def test_an_iterable_datasets_mid_epoch_state_is_said_at_load_state_dict(no_leaks):
    state = _state_after_a_batch(hr.DataLoader(Stream(), batch_size=4))
    second = hr.DataLoader(Stream(), batch_size=4)
    with pytest.warns(hr.IterablePositionWarning) as caught:
        second.load_state_dict(state)
    assert [w.filename for w in caught] == [__file__]


def test_a_corrupt_profile_store_is_said_at_the_loop(tmp_path, no_leaks):
    # reached from iter() through the planning, it named headrace/profiler/store.py
    from tests.unit.test_profile_store import _corrupt_store

    path = tmp_path / "profiles.sqlite"
    _corrupt_store(path)
    loader = hr.DataLoader(Values(), batch_size=4, options=hr.Options(profile_store=str(path)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:
            pass
    loader.close()
    told = _said(caught, "is corrupt")
    assert told and {w.filename for w in told} == {__file__}, [
        (w.filename, w.lineno) for w in told]


class Late(tud.Dataset):
    """Every sample waits for ``release`` (set by the test once the loader timed out): a
    step longer than the loader's timeout, for as long as the test needs it."""

    def __init__(self) -> None:
        self.release = mp.get_context("fork").Event()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        self.release.wait(60)
        return i


def test_a_timeout_is_not_chained_to_the_empty_queue_it_waited_on(no_leaks):
    # "During handling of the above exception (_queue.Empty), another exception occurred":
    # two tracebacks where torch shows one (a Ctrl-C in the wait showed the same)
    late = Late()
    loader = hr.DataLoader(late, batch_size=2, num_workers=1, timeout=1,
                           multiprocessing_context="fork")
    try:
        with pytest.raises(RuntimeError, match="DataLoader timed out") as info:
            next(iter(loader))
    finally:
        late.release.set()
        loader.close()
    assert info.value.__context__ is None
