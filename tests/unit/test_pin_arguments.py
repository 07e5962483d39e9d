"""Which device batches are pinned for, from ``Options(device=)`` and ``pin_memory_device``
(pure: the accelerator and its device count are given, so no GPU is needed)."""

import pytest
import torch

from headrace.runtime.pin_arguments import named_device, pin_device

CUDA = torch.device("cuda")


def test_pin_device_follows_the_prefetch_device_else_the_accelerator():
    dev = torch.device("cuda", 1)
    assert pin_device("", dev) == (dev, None)  # Options(device=) wins: batches are copied there
    if not torch.accelerator.is_available():
        assert pin_device("cuda:0", None) == (None, None)  # nothing to pin for: torch's warning


@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:1", torch.device("cuda", 1)])
def test_a_device_of_the_current_accelerator_is_used(value):
    assert named_device(value, CUDA, count=2) == (torch.device(value), None)


@pytest.mark.parametrize(("value", "why"), [
    ("cuda:3", "this machine has 1 cuda device"),  # the hunt's: it was taken as it was
    ("xpu:0", "not the current accelerator (cuda)"),
    ("bogus", "not a device"),
    ("cuda:-1", "not a device"),
    (["cuda"], "not a device"),
])
def test_a_device_this_machine_lacks_falls_back_to_the_accelerator_with_a_warning(value, why):
    """torch 2.13 ignores pin_memory_device and uses the current accelerator; headrace uses the
    device named to fence the loop's own copies, so a wrong one is named in a warning, not
    taken (a stream on a device that is not there failed at every buffer's release)."""
    device, text = named_device(value, CUDA, count=1)
    assert device == CUDA
    assert text is not None and text.startswith(f"pin_memory_device={value!r}: ") and why in text
