"""pin_memory and pin_memory_device: what torch's iterator warns, and how often, on a machine
without an accelerator (the CUDA paths are in tests/gpu)."""

import warnings

import pytest
import torch

from tests.conformance.conftest import flat, is_headrace
from tests.conformance.datasets import Squares

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.accelerator.is_available(), reason="this machine has an accelerator"),
]

SQ = [i * i for i in range(20)]
NO_ACCELERATOR = "'pin_memory' argument is set as true but no accelerator is found"


def _shut(loader):
    """Stop persistent workers now (torch's through its iterator, headrace's with close())."""
    if is_headrace(type(loader)):
        loader.close()
    elif loader._iterator is not None:
        loader._iterator._shutdown_workers()


def _warnings_over(loader, epochs: int) -> list[str]:
    """The warnings' texts over ``epochs`` whole epochs of ``loader`` (each checked), then
    its persistent workers stopped."""
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(epochs):
                assert flat(loader) == SQ[:4]
    finally:
        _shut(loader)
    return [str(w.message) for w in seen]


def test_pin_memory_without_an_accelerator(Loader, no_leaks):
    with pytest.warns(UserWarning, match="no accelerator is found"):
        got = list(Loader(Squares(4), batch_size=2, num_workers=1, pin_memory=True))
    assert [b.tolist() for b in got] == [SQ[0:2], SQ[2:4]]
    assert not any(b.is_pinned() for b in got)


@pytest.mark.parametrize("kw", [{"num_workers": 0}, {"num_workers": 1},
                                {"num_workers": 1, "persistent_workers": True}])
def test_the_no_accelerator_warning_comes_once_per_iterator_torch_makes(Loader, kw, no_leaks):
    """torch warns when it creates an iterator: at every iter(), but with persistent workers
    once, as one iterator serves every epoch (headrace warned every epoch: a hunt)."""
    texts = _warnings_over(Loader(Squares(4), batch_size=2, pin_memory=True, **kw), 3)
    assert sum(NO_ACCELERATOR in t for t in texts) == (1 if kw.get("persistent_workers") else 3)


@pytest.mark.parametrize("workers", [0, 1])
def test_headrace_points_its_pin_warnings_at_the_users_loop(workers, no_leaks):
    """torch's point into torch's dataloader.py; headrace's at the line that called iter()
    (they pointed into headrace's epochs.py, where no filter by module could reach them)."""
    import headrace as hr

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loader = hr.DataLoader(Squares(4), batch_size=2, num_workers=workers, pin_memory=True,
                               pin_memory_device="cuda")
        assert [b.tolist() for b in loader] == [SQ[0:2], SQ[2:4]]  # iter() on this line
    assert [(w.filename, str(w.message)[:40]) for w in seen] == [
        (__file__, _deprecated("cuda")[:40]), (__file__, NO_ACCELERATOR[:40])]


def _deprecated(value) -> str:
    return ("pin_memory_device is deprecated, the current accelerator will be used as the "
            f"device,ignore pin_memory_device='{value}'.")  # torch 2.13's words


@pytest.mark.parametrize("value", ["cuda", "cuda:3", "bogus"])
@pytest.mark.parametrize("kw", [{"num_workers": 0}, {"num_workers": 1, "persistent_workers": True}])
def test_pin_memory_device_is_deprecated_and_ignored(Loader, value, kw, no_leaks):
    """torch 2.13 warns, once per iterator it makes, and ignores the value (any: a malformed
    one too); headrace gave no warning. Without pin_memory=True neither reads it."""
    loader = Loader(Squares(4), batch_size=2, pin_memory=True, pin_memory_device=value, **kw)
    once = [_deprecated(value), NO_ACCELERATOR]
    texts = [t[:len(NO_ACCELERATOR)] if NO_ACCELERATOR in t else t
             for t in _warnings_over(loader, 2)]
    assert texts == (once if kw.get("persistent_workers") else once * 2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert flat(Loader(Squares(4), batch_size=2, pin_memory_device=value)) == SQ[:4]
    assert [str(w.message) for w in seen] == []
