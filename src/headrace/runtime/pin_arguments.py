"""The ``pin_memory`` and ``pin_memory_device`` arguments, read at ``iter()`` as torch reads them.

torch 2.13 reads them when it creates an iterator (``_BaseDataLoaderIter.__init__``): with
``pin_memory=True`` it warns that pinning does nothing on a machine without an accelerator.
It creates an iterator at every ``iter()``, except with ``persistent_workers=True``, where one
iterator serves every epoch of the loader, so its warning comes once, not every epoch.
headrace starts an epoch at every ``iter()`` and warns where torch's iterator would be new
(:func:`torch_iterator_is_new`), in torch's words.

What pins: on a CUDA machine the loader's batch memory becomes pinned buffers
(``runtime/pinning.py``); torch's helper pins what the pool does not hold. Which device fences
the user's own copies: ``Options(device=)``, else ``pin_memory_device``, else the current
accelerator, as torch does.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from headrace.runtime.bufferpool import BufferPool
from headrace.runtime.pinning import host_memory_for

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader

_STACKLEVEL = 5
"""Frames from :func:`pin_fn`'s ``warnings.warn`` to the user's ``iter()`` (``pin_fn`` ←
``epochs.make_iterator`` ← ``epochs.start_epoch`` ← ``DataLoader.__iter__`` ← the user), so a
warning names the user's line, not headrace's."""


def torch_iterator_is_new(loader: DataLoader) -> bool:
    """Whether torch's DataLoader would create a new iterator for this ``iter()`` (and warn
    about its arguments): always, but with persistent workers only at the loader's first
    (this loader object started no epoch before: its ``_epoch_ref`` is no weak reference yet).
    A loader unpickled or copied is a new one, as torch's."""
    persistent = loader.persistent_workers and bool(loader.num_workers)
    return not (persistent and isinstance(loader._epoch_ref, weakref.ref))


def pin_fn(loader: DataLoader) -> Callable[[Any], Any] | None:
    """What pins a finished batch (``None``: no pinning); switches the loader's batch memory
    to pinned buffers when an accelerator is there (``runtime/pinning.py``). Warns as torch's
    iterator does, where torch's would be new (:func:`torch_iterator_is_new`)."""
    new = torch_iterator_is_new(loader)
    if not loader.pin_memory and loader._device is None:
        return None
    if not torch.accelerator.is_available():
        if new:
            warnings.warn(  # torch's own words, at the same moment (iterator creation)
                "'pin_memory' argument is set as true but no accelerator is found, "
                "then device pinned memory won't be used.",
                UserWarning, stacklevel=_STACKLEVEL)
        return None
    device = pin_device(loader.pin_memory_device, loader._device)
    memory = host_memory_for(device) if device is not None else None
    if memory is not None and not loader._buffers.pinned:
        loader._buffers = BufferPool(memory=memory)  # batches assembled in pinned memory
    kind = device.type if device is not None else None
    return lambda b: _pin_memory(b, kind)  # the rest: small or user-collated leaves


def pin_device(pin_memory_device: str, device: torch.device | None) -> torch.device | None:
    """The accelerator batches are pinned for, or ``None`` when none is present.

    ``device``: ``Options(device=)`` when set (batches are copied there). Else
    ``pin_memory_device`` when given (torch 2.13 deprecates and ignores it; headrace fences
    released buffers on that device's stream), else the current accelerator, as torch does.
    """
    if device is not None:
        return device
    if not torch.accelerator.is_available():
        return None
    acc = torch.accelerator.current_accelerator()
    if pin_memory_device:
        wanted = torch.device(pin_memory_device)
        if acc is not None and wanted.type != acc.type:
            warnings.warn(
                f"pin_memory_device={pin_memory_device!r} is not the current accelerator "
                f"({acc.type}); memory is pinned for {acc.type}, as torch does",
                stacklevel=4,
            )
            return torch.device(acc.type)
        return wanted
    return torch.device(acc.type) if acc is not None else None
