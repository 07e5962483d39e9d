"""Hugging Face Accelerate with a headrace loader: sharded per rank, batches on the device,
``end_of_dataloader`` signalled, the loader's state in ``save_state`` / ``load_state``.

``accelerator.prepare(loader)`` rebuilds any ``torch.utils.data.DataLoader`` as a plain torch
loader from its attributes, so a bare headrace loader would silently lose headrace; it raises
instead (``headrace.integrations.ACCELERATE_PREPARE``). :func:`prepare_data_loader` builds the
prepared loader itself and hands it to Accelerate through the hook Accelerate offers for
already-prepared loaders (``_is_accelerate_prepared``), so Accelerate registers it (for
``save_state``, ``gather_for_metrics``, gradient accumulation) without rebuilding it::

    from headrace.integrations.accelerate import prepare

    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)

How: a shuffled headrace loader is rebuilt with a ``DistributedSampler`` for this rank (its
seed from rank 0, so every rank splits the same permutation, and in the state dict;
``set_epoch`` is called by Accelerate each epoch, from the saved epoch after ``load_state``) where the ranks' shares are equal, else as below over a permutation
seeded alike on every rank; any other (``shuffle=False``, a custom sampler or batch sampler) with
Accelerate's own ``BatchSamplerShard``, whose layout ``gather_for_metrics`` expects, a random
sampler's ``generator`` synchronised from rank 0 at every epoch as Accelerate does. It is then
wrapped in :class:`HeadraceShard`, an Accelerate ``DataLoaderShard`` whose inner loader is the
headrace one: Accelerate's own iteration code moves batches to the device, looks one batch ahead
to set ``end_of_dataloader`` (so gradient accumulation syncs at the epoch's last batch, as with
torch's loader) and snapshots ``state_dict()`` before each batch it fetches.

Not supported (raise): ``split_batches=True`` and ``dispatch_batches=True`` (both need the
global batch in one process); an ``IterableDataset``; ``use_seedable_sampler=True`` on a
shuffled loader without a seed of its own (it was silently ignored: the order moved with other
draws from torch's global generator; ``generator=`` or ``Options(seed=)`` give what it asks).
Where a ``DistributedSampler`` would pad (the dataset's length is not a multiple of the
processes), a shuffled loader is sharded as Accelerate shards one (whole batches of one
permutation per rank, in order: no sample-aware batching), so ``gather_for_metrics`` trims the
padding and not a real sample; with ``even_batches=False`` there is no padding, and the last
ranks get a batch fewer or a short one, as with Accelerate's own loaders. A shuffled loader
with ``batch_size=None`` (a sample a step) is always padded to the same count on every rank.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.utils.data as tud
from accelerate import Accelerator
from accelerate.data_loader import BatchSamplerShard, DataLoaderShard, get_sampler
from accelerate.utils import RNGType, broadcast_object_list

from headrace.errors import HeadraceError
from headrace.runtime import distributed, ranks
from headrace.runtime.loader import DataLoader

__all__ = ["HeadraceShard", "prepare", "prepare_data_loader", "skip_first_batches"]

_SEED = "accelerate_sampler_seed"
"""The ``DistributedSampler``'s seed in :meth:`HeadraceShard.state_dict`."""
_ITERATION = "accelerate_iteration"
"""The shard's ``iteration`` (the epoch Accelerate gives the sampler) in its state."""

_SKIP_OUTSIDE = (
    "this headrace loader's batches were requested outside headrace: accelerate's "
    "skip_first_batches() rebuilds a plain torch DataLoader. Resume with accelerator.load_state() "
    "(headrace's state is exact, nothing to skip), or use "
    "headrace.integrations.accelerate.skip_first_batches(loader, n)."
)


class _Guarded(tud.BatchSampler):
    """What :class:`HeadraceShard` shows Accelerate as its batch sampler: the headrace loader's
    own, for reading (``batch_size``, ``sampler.set_epoch``, ``len``), but iterating it raises,
    since only code that replaces headrace by a torch loader iterates it (``skip_first_batches``)."""

    def __init__(self, inner: Any, num_processes: int) -> None:  # no super(): nothing to build
        self.inner = inner
        self.num_processes = num_processes
        self.sampler = getattr(inner, "sampler", None)  # type: ignore[assignment]
        self.batch_size = getattr(inner, "batch_size", None)  # type: ignore[assignment]
        self.drop_last = getattr(inner, "drop_last", False)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Any:
        raise HeadraceError(_SKIP_OUTSIDE)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class HeadraceShard(DataLoaderShard):
    """Accelerate's ``DataLoaderShard`` over a headrace loader (``base_dataloader``).

    Accelerate saves and restores its ``state_dict()`` (the headrace loader's, taken before
    each batch is fetched, so it counts exactly the batches the training loop received).
    ``drop_last``: the user's loader's (None: ``loader``'s own). A loader rebuilt over a batch
    sampler reads False, and ``gather_for_metrics`` then trimmed the last gathered step of a
    ``drop_last=True`` loader to ``len(dataset) % total_batch_size`` samples, though it was
    full. ``rng_types`` and ``synchronized_generator``: what ``DataLoaderShard.__iter__``
    synchronises from rank 0 before each epoch (None: nothing).
    """

    def __init__(self, loader: DataLoader, device: torch.device | None, num_processes: int,
                 process_index: int = 0, non_blocking: bool = False, skip_batches: int = 0,
                 iteration: int = 0, drop_last: bool | None = None,
                 rng_types: list[Any] | None = None,
                 synchronized_generator: torch.Generator | None = None) -> None:
        # DataLoaderShard builds a torch DataLoader over the dataset (idle: no worker starts
        # before iter()); it is replaced by the headrace loader right away.
        super().__init__(loader.dataset, device=device, rng_types=rng_types,
                         synchronized_generator=synchronized_generator,
                         skip_batches=skip_batches,
                         _drop_last=loader.drop_last if drop_last is None else drop_last,
                         _non_blocking=non_blocking, iteration=iteration)
        self.base_dataloader = loader
        self.num_processes = num_processes
        self.process_index = process_index
        self.use_stateful_dataloader = True  # makes save_state / load_state keep state_dict()
        self._is_accelerate_prepared = True  # Accelerate's hook: registered, never rebuilt
        self.dl_state_dict = loader.state_dict()
        self._ended_before: int | None = None  # see load_state_dict

    @property
    def batch_sampler(self) -> Any:
        return _Guarded(self.base_dataloader.batch_sampler, self.num_processes)

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes (``gather_for_metrics`` trims with it): the
        batch sampler's size where the loader was rebuilt over ``BatchSamplerShard`` (its own
        ``batch_size`` is then None, and a step counted one sample a rank: the last gathered
        step was trimmed to its first sample or two)."""
        loader = self.base_dataloader
        size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None) or 1
        return int(size) * self.num_processes

    def state_dict(self) -> dict[str, Any]:
        """The headrace loader's state as of the last batch handed out, with the seed of the
        ``DistributedSampler`` this rank's share is drawn with (a shuffled loader without a
        seed of its own drew it at ``prepare``: a resumed process draws another). With several
        processes, every rank's (a collective: call it on all ranks, as ``save_state`` is):
        Accelerate writes one ``dl_state_dict.bin`` for all ranks, and each rank's share of the
        epoch is its own, so each rank restores its entry."""
        state = {_ITERATION: self.iteration, **super().state_dict()}  # (a snapshot's own first)
        sampler = self.base_dataloader.sampler
        if isinstance(sampler, tud.DistributedSampler):
            state[_SEED] = sampler.seed
        return state if self.num_processes == 1 else ranks.gather_all(state, self.num_processes)

    def _update_state_dict(self) -> None:
        """Accelerate's snapshot before each batch, with the epoch the sampler is given at the
        next ``iter()``: this one's, or once its last batch is out (``end_of_dataloader``,
        saved as ``_iterator_finished``) the next one's, which ``iteration`` counts only when
        the loop asks past that batch: a state saved in the loop's body at the epoch's last
        batch resumed with the finished epoch's ``set_epoch``."""
        super()._update_state_dict()
        self.dl_state_dict[_ITERATION] = self.iteration + int(self.end_of_dataloader)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the headrace loader's state, the ``DistributedSampler``'s seed, and the
        epoch Accelerate gives the sampler at the next ``iter()`` (``set_epoch(iteration)``):
        a new process counts from 0, and a state saved in a later epoch replayed that epoch's
        positions over epoch 0's permutation, unless the script called ``set_epoch`` itself."""
        if ranks.GATHERED in state_dict:
            state_dict = state_dict[ranks.GATHERED][self.process_index]
        state = {k: v for k, v in state_dict.items()  # Accelerate's key, and ours
                 if k not in ("_iterator_finished", _SEED, _ITERATION)}
        sampler = self.base_dataloader.sampler
        if state_dict.get(_SEED) is not None and isinstance(sampler, tud.DistributedSampler):
            sampler.seed = int(state_dict[_SEED])
        self.base_dataloader.load_state_dict(state)
        # Accelerate's own count (it moves only when an epoch is read to its end; headrace's
        # at every iter()), else (a state saved before it was kept) headrace's
        self.iteration = int(state_dict.get(_ITERATION, state.get("epoch")) or 0)
        self.dl_state_dict = self.base_dataloader.state_dict()
        # saved once its epoch's last batch was out (Accelerate's _iterator_finished; headrace's
        # state is then between epochs): until the next epoch starts, skip_first_batches counts
        # that epoch as delivered (it skipped the next epoch's batches instead)
        ended = state_dict.get("_iterator_finished") is True and self.base_dataloader._resume is None
        self._ended_before = self.base_dataloader._epoch if ended else None

    def __reduce__(self) -> Any:
        """Pickles as its headrace loader and settings (``DataLoaderShard``'s own reduce
        would rebuild a torch loader); the copy is not registered with any accelerator."""
        return (HeadraceShard, (self.base_dataloader, self.device, self.num_processes,
                                self.process_index, self._non_blocking, self.skip_batches,
                                self.iteration, self._drop_last, self.rng_types,
                                self.synchronized_generator))


def prepare_data_loader(accelerator: Accelerator, loader: DataLoader,
                        device_placement: bool | None = None) -> HeadraceShard:
    """``accelerator.prepare_data_loader`` for a headrace loader: this rank's share, batches on
    ``accelerator.device`` (unless ``device_placement=False``), registered with the accelerator."""
    if not isinstance(loader, DataLoader):
        raise TypeError(f"expected a headrace.DataLoader, got {type(loader).__name__}; "
                        "use accelerator.prepare() for torch loaders")
    if isinstance(loader.dataset, tud.IterableDataset):
        raise HeadraceError("an IterableDataset is iterated by torch's own code; prepare a "
                            "torch DataLoader over it with accelerator.prepare()")
    if accelerator.split_batches or accelerator.dispatch_batches:
        raise HeadraceError("split_batches / dispatch_batches need the global batch in one "
                            "process; headrace shards samples per rank: leave both off")
    if (getattr(accelerator, "use_seedable_sampler", False)
            and isinstance(loader.sampler, tud.RandomSampler) and loader.sampler.generator is None
            and loader.generator is None and loader.options.seed is None):
        raise HeadraceError(
            "use_seedable_sampler=True asks for a shuffle order that other draws from torch's "
            "global generator do not move; Accelerate's SeedableRandomSampler is not applied to "
            "a headrace loader: give it its own seed instead, "
            "generator=torch.Generator().manual_seed(s) or options=headrace.Options(seed=s)")
    n, rank = accelerator.num_processes, accelerator.process_index
    sharded = _shard(loader, n, rank, accelerator.even_batches) if n > 1 else loader
    generator = _synchronized_generator(loader) if sharded is not loader else None
    rng_types = [t for t in accelerator.rng_types if RNGType(t) is not RNGType.GENERATOR]
    if generator is not None:
        rng_types.append("generator")
    if device_placement is None:
        device_placement = accelerator.device_placement
    shard = HeadraceShard(sharded, accelerator.device if device_placement else None, n, rank,
                          non_blocking=accelerator.non_blocking, drop_last=loader.drop_last,
                          rng_types=rng_types or None, synchronized_generator=generator)
    return accelerator.prepare_data_loader(shard)  # already prepared: only registered


def prepare(accelerator: Accelerator, *objects: Any, **kwargs: Any) -> Any:
    """``accelerator.prepare(*objects)`` with every headrace loader among them prepared by
    :func:`prepare_data_loader` first (the others are Accelerate's as usual)."""
    objs = [prepare_data_loader(accelerator, o) if isinstance(o, DataLoader) else o
            for o in objects]
    return accelerator.prepare(*objs, **kwargs)


def skip_first_batches(loader: HeadraceShard, num_batches: int = 0) -> HeadraceShard:
    """Accelerate's ``skip_first_batches`` for a prepared headrace loader: the next epoch of the
    same headrace loader, without its first ``num_batches`` batches (they are still loaded).

    After ``accelerator.load_state()`` headrace resumes exactly where the saved epoch was, so
    the batches it had delivered count among the ``num_batches``: Accelerate's resume pattern
    (``load_state`` then ``skip_first_batches(loader, resume_step)``) skipped them twice.
    A state saved at its epoch's last batch leaves that epoch nothing: ``num_batches`` of
    ``len(loader)`` or more then yields no batch and starts no epoch (it skipped the next
    epoch's batches, and every later epoch came one permutation late)."""
    if not isinstance(loader, HeadraceShard):
        raise TypeError("expected a loader returned by headrace's prepare_data_loader")
    base = loader.base_dataloader
    if loader._ended_before is not None and loader._ended_before == base._epoch \
            and base._resume is None and num_batches >= len(loader):
        # the loaded state was saved at its epoch's end: that epoch has nothing left, and
        # iterating would start the next one only to drop it (torch's skip yields nothing too)
        kind: type[HeadraceShard] = _Delivered
    else:
        kind, num_batches = HeadraceShard, max(0, num_batches - _resumed_batches(base))
    return kind(base, loader.device, loader.num_processes, loader.process_index,
                non_blocking=loader._non_blocking, skip_batches=num_batches,
                iteration=loader.iteration, drop_last=loader._drop_last,
                rng_types=loader.rng_types, synchronized_generator=loader.synchronized_generator)


class _Delivered(HeadraceShard):
    """What :func:`skip_first_batches` gives for an epoch a loaded state had read to its end:
    an iteration of no batch that starts no epoch of the headrace loader (Accelerate's gradient
    state sees it begin and end, as it does torch's skip of a whole epoch)."""

    def __iter__(self) -> Any:
        self.begin()
        self.end()
        return iter(())


def _resumed_batches(loader: DataLoader) -> int:
    """Batches of the epoch a loaded state dict resumes (0: none loaded): as the state dict
    counted them, else (one saved before it counted them) the samples it had delivered, in
    batches of the loader's size (the last one short)."""
    point = loader._resume
    if point is None:
        return 0
    if point.batches:
        return point.batches
    size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None) or 1
    return -(-point.delivered.count // int(size))


def _own_order(loader: DataLoader) -> bool:
    """Whether :func:`_shard` deals out the loader's own batches (``BatchSamplerShard``): a
    batch sampler or a sampler of the user's other than ``RandomSampler``."""
    return loader._user_batch_sampler or not isinstance(loader.sampler, tud.RandomSampler)


def _synchronized_generator(loader: DataLoader) -> torch.Generator | None:
    """The generator a random sampler of the user's draws its order from, for the ranks to
    share (``DataLoaderShard.__iter__`` sends rank 0's state to every rank before each epoch),
    as Accelerate's ``prepare_data_loader`` does for torch's loaders; one drawn from torch's
    global generator is given to a sampler that has none. Without it each rank dealt itself
    batches of its own permutation (``SubsetRandomSampler``, ``WeightedRandomSampler``): ranks
    seeded apart saw 28-30 distinct samples of 40 an epoch. None: the order is not the user's
    (a shuffled loader's is seeded alike on every rank by :func:`_shard`), or not random."""
    if not _own_order(loader):
        return None
    sampler = get_sampler(loader)
    if sampler is None or not hasattr(sampler, "generator"):
        return None
    if sampler.generator is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
        sampler.generator = torch.Generator().manual_seed(seed)
    return sampler.generator if isinstance(sampler.generator, torch.Generator) else None


def _shard(loader: DataLoader, num_processes: int, rank: int,
           even_batches: bool = True) -> DataLoader:
    """The loader rebuilt to load this rank's share only; ``even_batches``: Accelerate's
    setting (False: no rank's share is padded, some get fewer samples)."""
    if distributed.is_sharded(loader._index_sampler):
        return loader  # the user sharded it already
    kwargs = _init_kwargs(loader)
    if _own_order(loader):
        # Any other order: Accelerate's own batch sharding (whole batches per rank, rank r the
        # batches r, r + n, ...; the last ones padded from the start). gather_for_metrics
        # trims the padding off the end of the last gathered step, which holds only in this
        # layout: a DistributedSampler over a sequential order (interleaved, padded by
        # wrapping) put a duplicate there and dropped a sample on 3 ranks and more.
        shard = BatchSamplerShard(loader.batch_sampler, num_processes=num_processes,
                                  process_index=rank, even_batches=even_batches)
        return DataLoader(batch_sampler=shard, **kwargs)
    seed = [loader.options.seed if loader.options.seed is not None
            else loader.generator.initial_seed() if loader.generator is not None
            else int(torch.empty((), dtype=torch.int64).random_().item())]
    broadcast_object_list(seed, from_process=0)  # one permutation for all ranks
    sampler: tud.DistributedSampler[Any] = tud.DistributedSampler(
        loader.dataset, num_replicas=num_processes, rank=rank, shuffle=True, seed=seed[0] % 2**63)
    dataset: Any = loader.dataset  # map-style, with a length (an IterableDataset raised)
    padded = len(sampler) * num_processes != len(dataset)
    # the padding stays last (a sample a step is padded whatever even_batches says)
    if padded and (even_batches or loader.batch_size is None) and kwargs.get("in_order") is None:
        kwargs["in_order"] = True
    if not padded or loader.batch_size is None:  # samples regrouped, or a sample a step
        return DataLoader(sampler=sampler, batch_size=loader.batch_size,
                          drop_last=loader.drop_last, **kwargs)
    # The sampler would pad ranks with samples from the start of the permutation, spread over
    # the ranks' last samples, and gather_for_metrics trims the padding off the end of the
    # last gathered step: it kept a duplicate and dropped a real sample (with torch's batches
    # too). Accelerate's own layout instead: the permutation's batches dealt to the ranks,
    # the padding in the last batches, kept in order (one permutation per epoch from a
    # generator every rank seeds alike). even_batches=False: the same, unpadded.
    order = tud.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed[0] % 2**63))
    batches = tud.BatchSampler(order, loader.batch_size, loader.drop_last)
    shard = BatchSamplerShard(batches, num_processes=num_processes, process_index=rank,
                              even_batches=even_batches)
    return DataLoader(batch_sampler=shard, **kwargs)


_REPLACED = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


def _init_kwargs(loader: DataLoader) -> dict[str, Any]:
    """The loader's ``__init__`` arguments read back from its attributes (``options`` and
    ``num_workers="auto"`` included), minus those that decide the order."""
    params = inspect.signature(DataLoader.__init__).parameters
    kwargs = {k: getattr(loader, k) for k in params if k != "self" and k not in _REPLACED
              and hasattr(loader, k)}
    kwargs["dataset"] = loader.dataset
    return kwargs
