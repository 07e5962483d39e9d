"""Device prefetch: the next batches are copied to the accelerator while the current one trains.

With ``Options(device="cuda")`` the epoch iterator is wrapped in a :class:`DevicePrefetcher`.
On each ``next()`` it queues the host-to-device copy of every batch the scheduler has ready
(up to :data:`DEPTH` ahead) on a side CUDA stream, then returns the oldest one, after ordering
the training loop's current stream behind that batch's copy (``wait_event``) and telling the
caching allocator the batch is used on that stream (``record_stream``), so the loop can use it
at once and its memory is not recycled under it. No thread is involved: copies are queued from
the training thread, asynchronously, from pinned memory (a device implies pinning).
``Options(device="cpu")`` wraps nothing: batches are in host memory already.

Exactness: a batch taken from the scheduler and copied ahead is not delivered. The epoch's
bitmap is marked only when ``next()`` returns the batch (``EpochBase.take`` / ``mark`` in
``runtime/epoch.py``), so a ``state_dict()`` taken between two ``next()`` calls names exactly
the batches the loop received; the ones in flight are delivered again after a resume. A
batch's error met while taking batches ahead (its ``collate_fn`` raised) is raised in its
turn, after the batches taken before it (it came before them).

The host side of each copy is fenced in the buffer pool (``BufferPool.fence``) with the event
recorded after the copy, so pinned batch memory is reused only once its copy has completed.

The stream work sits behind :class:`DeviceCopier`, so the bookkeeping is tested on the CPU
with a fake copier.

What is copied: the tensors of dicts, lists, tuples and namedtuples (torch's pytree), at any
depth. A batch holding tensors inside another kind of object (a dataclass, a ``UserDict``, a
custom batch class with its own ``.to()``/``.pin_memory()``) is handed over with those tensors
in host memory; the first such batch of a prefetcher is warned about (:func:`unmoved`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

from headrace.runtime.pinning import Fence

DEPTH = 2
"""Batches copied to the device ahead of the one the training loop receives (the copies of
batch k+1 and k+2 run while batch k trains). Device memory holds ``DEPTH + 1`` batches at most
beyond what the loop keeps."""


class DeviceCopier(Protocol):
    """Queues copies to one device and orders their use (``CudaCopier``; fakes in tests)."""

    def copy(self, batch: Any) -> tuple[Any, Fence]:
        """Queue the copy of every tensor of ``batch``; the device batch (same structure) and
        a fence that completes once every copy has."""
        ...

    def hand_over(self, batch: Any, fence: Fence) -> None:
        """Make the training loop's current stream wait for ``fence`` before using ``batch``."""
        ...


class CudaCopier:
    """Copies on one side stream of ``device``; the loop's stream waits on a per-batch event."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def copy(self, batch: Any) -> tuple[Any, Fence]:
        with torch.cuda.stream(self.stream):
            out = tree_map_only(torch.Tensor, lambda t: t.to(self.device, non_blocking=True), batch)
            event = torch.cuda.Event()
            event.record(self.stream)
        return out, event

    def hand_over(self, batch: Any, fence: Fence) -> None:
        current = torch.cuda.current_stream(self.device)
        current.wait_event(fence)  # type: ignore[arg-type]
        for t in tree_leaves(batch):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                t.record_stream(current)  # allocated on the side stream, used on this one


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """The CUDA device of ``Options(device=)``, with its index; ``None``: no device prefetch,
    for ``None`` and for the CPU (batches are in host memory already: nothing to copy, so
    ``device = "cuda" if torch.cuda.is_available() else "cpu"`` runs on a CPU machine).

    Raises ``ValueError`` for a device that is neither the CPU nor a CUDA device present on
    this machine.
    """
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cpu":
        return None
    if dev.type != "cuda":
        raise ValueError(
            f"Options(device={device!r}): device prefetch copies batches to a CUDA device "
            "('cuda', 'cuda:N' or torch.accelerator.current_accelerator()); device='cpu' or "
            "None receives batches in host memory"
        )
    if not torch.cuda.is_available():
        raise ValueError(f"Options(device={device!r}): CUDA is not available on this machine; "
                         "use device='cpu' (or None): batches stay in host memory")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ValueError(f"Options(device={device!r}): this machine has "
                         f"{torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def unmoved(batch: Any) -> str | None:
    """The type of the first object in ``batch`` that device prefetch does not look into
    though it may hold tensors (a dataclass, a mapping or sequence pytree does not know, an
    object with its own ``.to()`` or ``.pin_memory()``); None where every such leaf is plain."""
    for leaf in tree_leaves(batch):
        if isinstance(leaf, (torch.Tensor, str, bytes, int, float, bool, complex)) or leaf is None:
            continue
        if (dataclasses.is_dataclass(leaf) or isinstance(leaf, Mapping)
                or callable(getattr(leaf, "to", None))
                or callable(getattr(leaf, "pin_memory", None))):
            return type(leaf).__name__
    return None


def copier_for(device: torch.device | None) -> DeviceCopier | None:
    """The copier device prefetch uses for ``device`` (``None``: prefetch off)."""
    return CudaCopier(device) if device is not None else None


class DevicePrefetcher:
    """One epoch's batches, copied to the device ahead of ``next()``.

    ``epoch``: the epoch iterator (``runtime/epoch.py``); ``fence_host(tensors, fence)``: tells
    the buffer pool which copy reads a batch's host memory (``BufferPool.fence``).
    Presents what the loader reads of an epoch (``origin``, ``delivered``, ``empty_batches``,
    ``closed``, ``close``, ``stats``, ``pool``); everything else is the wrapped ``epoch``'s.
    """

    def __init__(
        self,
        epoch: Any,
        copier: DeviceCopier,
        fence_host: Callable[[list[torch.Tensor], Fence], Any] | None = None,
        depth: int = DEPTH,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.epoch = epoch
        self.copier = copier
        self.fence_host = fence_host
        self.depth = depth
        self._ahead: deque[tuple[Any, Any, Fence]] = deque()  # (device batch, positions, fence)
        self._error: Exception | None = None  # a batch's error met taking ahead, for its turn
        self.copied = 0  # batches whose copy was queued
        self._looked = False  # the first batch was looked into (``unmoved``)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if not self._ahead:
            if self._error is not None:  # its turn: the batches taken before it went out
                error, self._error = self._error, None
                try:
                    raise error
                finally:  # this frame is in its traceback: it must not hold it
                    error = None  # type: ignore[assignment]
            self.fill(block=True)  # StopIteration and the epoch's errors come from here
        while self._error is None and len(self._ahead) <= self.depth:
            try:  # the one returned now, and up to DEPTH copied behind it
                if not self.fill():
                    break
            except Exception as e:  # noqa: BLE001 - a batch's own (its collate_fn's): it
                self._error = e  # raised before the batches taken ahead of it; later, in turn
        batch, positions, fence = self._ahead.popleft()
        try:
            self.copier.hand_over(batch, fence)  # a second hand-over only waits again
            self.epoch.deliver(positions)
        except BaseException:  # a Ctrl-C: not delivered, the next next() returns it
            self._ahead.appendleft((batch, positions, fence))
            raise
        return batch

    def fill(self, block: bool = False) -> bool:
        """Take one more batch from the epoch and queue its copy; ``False`` when none was ready
        (``block=False``). Not delivered until ``next()`` returns it."""
        got = self.epoch.take(block=block)
        if got is None:
            return False
        batch, positions = got
        try:
            device_batch, fence = self.copier.copy(batch)
        except BaseException:  # not copied (a device out of memory, a Ctrl-C): the next take
            self.epoch.give_back(batch, positions)  # returns it again; it was lost for the
            raise  # rest of the epoch, which then ended as if whole
        if not self._looked:
            self._looked = True
            kind = unmoved(batch)
            if kind is not None:
                warnings.warn(
                    f"headrace: Options(device=...) copies the tensors of dicts, lists, tuples "
                    f"and namedtuples; this batch holds a {kind}, handed over as it is (its "
                    "tensors, if any, stay in host memory). Return a dict, or move it yourself "
                    "with its own .to(device)", stacklevel=3)
        if self.fence_host is not None:
            self.fence_host([t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)], fence)
        self._ahead.append((device_batch, positions, fence))
        self.copied += 1
        return True

    @property
    def in_flight(self) -> int:
        """Batches copied (or being copied) to the device and not yet returned."""
        return len(self._ahead)

    # -- what the loader reads of an epoch ------------------------------------------------------
    @property
    def origin(self) -> Any:
        return self.epoch.origin

    @property
    def steps(self) -> Any:
        return self.epoch.steps

    def __len__(self) -> int:
        return len(self.epoch)

    @property
    def delivered(self) -> Any:
        return self.epoch.delivered

    def settled_undelivered(self) -> int:
        return int(self.epoch.settled_undelivered())

    def known_length(self) -> int | None:
        n = self.epoch.known_length()
        return None if n is None else int(n)

    @property
    def empty_batches(self) -> int:
        return int(self.epoch.empty_batches)

    @property
    def batches_delivered(self) -> int | None:
        return self.epoch.batches_delivered

    @property
    def closed(self) -> bool:
        return bool(self.epoch.closed)

    @property
    def finished(self) -> bool:
        return bool(self.epoch.finished)

    @property
    def pool(self) -> Any:
        return getattr(self.epoch, "pool", None)

    def stats(self) -> Any:
        return self.epoch.stats()

    def close(self, replaced: bool = False) -> None:
        """Drop the batches copied ahead (never delivered), and a batch's error held back for
        its turn (the next ``next()`` raised it, not what a closed epoch raises), and close
        the epoch (idempotent)."""
        self._ahead.clear()
        self._error = None
        self.epoch.close(replaced=replaced)
