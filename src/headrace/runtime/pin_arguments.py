"""The ``pin_memory`` and ``pin_memory_device`` arguments, read at ``iter()`` as torch reads them.

torch 2.13 reads them when it creates an iterator (``_BaseDataLoaderIter.__init__``): with
``pin_memory=True`` it warns that a given ``pin_memory_device`` is deprecated and ignored (the
current accelerator is used), and that pinning does nothing on a machine without an
accelerator. It creates an iterator at every ``iter()``, except with ``persistent_workers=True``,
where one iterator serves every epoch of the loader, so its warnings come once, not every epoch.
headrace starts an epoch at every ``iter()`` and warns where torch's iterator would be new
(:func:`torch_iterator_is_new`), in torch's words.

What pins: on a CUDA machine the loader's batch memory becomes pinned buffers
(``runtime/pinning.py``); torch's helper pins what the pool does not hold. Which device fences
the user's own copies: ``Options(device=)``, else ``pin_memory_device`` where it names a device
of the current accelerator that this machine has, else the current accelerator, as torch does
(a value that names none is warned about, naming the argument. Taken as it was, ``"cuda:3"``
on a one-GPU machine made every released buffer's fence fail on a device that is not there,
which ``BufferPool`` takes for CUDA torn down: no pinned buffer was reused, silently).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data._utils.pin_memory import pin_memory as _pin_memory

from headrace.runtime.bufferpool import BufferPool
from headrace.runtime.pinning import host_memory_for
from headrace.user_frame import warn

if TYPE_CHECKING:
    from headrace.runtime.loader import DataLoader

def torch_iterator_is_new(loader: DataLoader) -> bool:
    """Whether torch's DataLoader would create a new iterator for this ``iter()`` (and warn
    about its arguments): always, but with persistent workers only at the loader's first
    (this loader object started no epoch before: its ``_epoch_ref`` is no weak reference yet).
    A loader unpickled or copied is a new one, as torch's."""
    persistent = loader.persistent_workers and bool(loader.num_workers)
    return not (persistent and isinstance(loader._epoch_ref, weakref.ref))


def warn_deprecated_device(loader: DataLoader) -> None:
    """torch's warning for ``pin_memory_device`` given with ``pin_memory=True`` (its words)."""
    if loader.pin_memory and loader.pin_memory_device:
        warn("pin_memory_device is deprecated, the current accelerator will be used as the "
             f"device,ignore pin_memory_device='{loader.pin_memory_device}'.")


def pin_fn(loader: DataLoader) -> Callable[[Any], Any] | None:
    """What pins a finished batch (``None``: no pinning); switches the loader's batch memory
    to pinned buffers when an accelerator is there (``runtime/pinning.py``). Warns as torch's
    iterator does, where torch's would be new (:func:`torch_iterator_is_new`)."""
    new = torch_iterator_is_new(loader)
    if new:
        warn_deprecated_device(loader)
    if not loader.pin_memory and loader._device is None:
        return None
    if not torch.accelerator.is_available():
        if new:
            warn("'pin_memory' argument is set as true but no accelerator is found, "  # torch's
                 "then device pinned memory won't be used.")  # words, at iterator creation
        return None
    device, unused = pin_device(loader.pin_memory_device, loader._device)
    if unused is not None and new:
        warn(unused)
    memory = host_memory_for(device) if device is not None else None
    if memory is not None and not loader._buffers.pinned:
        loader._buffers = BufferPool(memory=memory)  # batches assembled in pinned memory
    kind = device.type if device is not None else None
    return lambda b: _pin_memory(b, kind)  # the rest: small or user-collated leaves


def pin_device(pin_memory_device: Any, device: torch.device | None
               ) -> tuple[torch.device | None, str | None]:
    """The accelerator batches are pinned for (``None``: none is present), and why
    ``pin_memory_device`` is not the one used (``None``: it is, or it was not given).

    ``device``: ``Options(device=)`` when set (batches are copied there). Else
    ``pin_memory_device`` when given and usable (:func:`named_device`), else the current
    accelerator, as torch does.
    """
    if device is not None:
        return device, None
    if not torch.accelerator.is_available():
        return None, None
    acc = torch.accelerator.current_accelerator()
    if acc is None:
        return None, None
    if pin_memory_device:
        return named_device(pin_memory_device, acc, torch.accelerator.device_count())
    return torch.device(acc.type), None


def named_device(pin_memory_device: Any, accelerator: torch.device, count: int
                 ) -> tuple[torch.device, str | None]:
    """The device ``pin_memory_device`` names on a machine whose current accelerator is
    ``accelerator`` with ``count`` devices of its kind, and ``None``; or, where it names none
    of them (malformed, another kind, an index past ``count``), the current accelerator, as
    torch uses, and what a warning says of the value (pure: tested without a GPU)."""
    current = torch.device(accelerator.type)
    try:
        wanted = torch.device(pin_memory_device)
    except (RuntimeError, TypeError, ValueError) as e:
        why = f"it is not a device ({str(e).splitlines()[0]})"
    else:
        if wanted.type != accelerator.type:
            why = f"it is not the current accelerator ({accelerator.type})"
        elif wanted.index is not None and not 0 <= wanted.index < count:
            why = f"this machine has {count} {accelerator.type} device(s)"
        else:
            return wanted, None
    return current, (f"pin_memory_device={pin_memory_device!r}: {why}; memory is pinned for "
                     f"{accelerator.type} and your own copies are fenced on the current "
                     f"{accelerator.type} device, as torch uses the current accelerator")
