"""``state_dict`` contents: what makes a mid-epoch resume exact, and nothing more.

An epoch is fully determined by the random-number state at its start (which replays the
sampler's order and the base seed of per-sample randomness) plus one bit per position saying
whether the sample was delivered. Resuming replays the order and skips delivered positions;
per-sample seeds make the content of the rest identical. Size: a few KB of RNG state plus
N/8 bytes (zlib-compressed), JSON and ``torch.save`` friendly.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from headrace.errors import StateDictError
from headrace.pipeline.source import user_attr
from headrace.runtime import host_rngs, sampler_seeds, state_checks
from headrace.runtime.bitmap import Bitmap
from headrace.runtime.order_digest import OrderDigest
from headrace.runtime.sampler_seeds import Seeds
from headrace.user_frame import warn

SCHEMA_VERSION = 2
"""2 added the executed step order and what identifies the dataset and steps (for warnings);
a version-1 state dict still loads."""
BY_INDEX_VERSION = 3
"""3: the delivered bitmap is over sample indices (``delivered_by: "index"``, ODS); only such
state dicts carry it, so a headrace that reads 2 refuses them instead of misreading the bits."""
READABLE_VERSIONS = (1, 2, 3)


def rng_to_str(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def rng_from_str(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def sampler_generators(index_sampler: Any, loader_generator: torch.Generator | None
                       ) -> tuple[torch.Generator, ...]:
    """The ``torch.Generator``s a sampler draws its order from, other than the loader's own
    ``generator=`` (already saved): ``RandomSampler(generator=g)`` and the like, also inside a
    ``BatchSampler`` or a batch sampler wrapping one (Accelerate's ``BatchSamplerShard`` holds
    its ``batch_sampler``). Without them in the state dict a resume in a later epoch replayed
    another order (the generator had moved on), delivering some samples twice and others never."""
    out: list[torch.Generator] = []
    s, seen = index_sampler, set()
    while s is not None and id(s) not in seen:
        seen.add(id(s))
        g = user_attr(s, "generator")
        if (isinstance(g, torch.Generator) and g is not loader_generator and g not in out
                and g is not torch.default_generator):  # the global one: the training loop's
            out.append(g)
        inner = user_attr(s, "sampler")
        s = inner if inner is not None else user_attr(s, "batch_sampler")
    return tuple(out)


def set_states(generators: tuple[torch.Generator, ...], states: tuple[torch.Tensor, ...]) -> None:
    """Put saved ``states`` back into ``generators`` (a sampler built the same way)."""
    if len(states) != len(generators):
        raise StateDictError(
            f"state dict saved {len(states)} sampler generator(s), this loader's sampler has "
            f"{len(generators)} now: build the sampler as the run that saved it did (a sampler "
            "that makes its generator in __iter__ cannot be replayed: give it one when it is "
            "built)")
    for g, st in zip(generators, states, strict=True):
        g.set_state(st)


def capture_rng(generator: torch.Generator | None) -> torch.Tensor:
    """The state the epoch's draws come from: the loader's generator, else torch's global one."""
    return generator.get_state() if generator is not None else torch.get_rng_state()


@dataclasses.dataclass(frozen=True)
class Identity:
    """What a state dict must match, and what it only reports.

    A resume is refused only when it would deliver other samples: another ``samples`` (the
    dataset's length), or mid-epoch another ``positions`` (the samples an epoch delivers: the
    sampler's length less what ``drop_last`` leaves out; ``batches`` per epoch where that is
    unknown). Another dataset identity, changed step code, another ``batch_size`` or
    ``drop_last`` that leaves the epoch's samples as they were (an edited script) is reported in
    a warning and the resume goes on: positions, seeds and the step order are what decide which
    samples come and with what content; the batch settings only how they are grouped.
    """

    samples: int | None  # None: a map-style dataset without __len__
    batches: int | None  # None: a sampler or batch sampler without __len__
    dataset: str  # the source's fingerprint (class, length, code; or its own fingerprint())
    steps: tuple[str, ...]  # the executed step order (names; "load" excluded): between epochs,
    # the order the next epoch runs
    step_code: dict[str, str]  # step name -> digest of its traits and code (fingerprint.py)
    delivered_by: str = "position"  # "index" under ODS (Cache(ods=True)): positions no longer
    # say which sample they delivered, so the delivered bitmap is over sample indices
    positions: int | None = None  # samples an epoch delivers (None: unknown)
    batch_size: int | None = None  # what the sampler's batches are cut with (span.batching)
    drop_last: bool = False
    shuffle: bool | None = None  # the order's shuffle (ordering.shuffle_of; None: unknown)


@dataclasses.dataclass(frozen=True)
class EpochOrigin:
    """What an epoch's order and seeds were drawn from (kept by each epoch iterator)."""

    epoch: int
    rng: torch.Tensor
    base_seed: int
    drew_base_seed: bool  # False for later epochs of persistent workers (torch draws once)
    sampler_rngs: tuple[torch.Tensor, ...] = ()  # the sampler's own generators at epoch start
    global_rng: torch.Tensor | None = None  # torch's global generator at epoch start, where
    # ``rng`` is the loader's own: a sampler built without a generator draws from the global one
    first_read: FirstRead | None = None  # the states at the sampler's first read, where it came
    # after iter() (``num_workers=0``: at the first next(), as torch reads it)
    host_rngs: host_rngs.HostRngs | None = None  # Python's and NumPy's global generators at
    # epoch start, where reading the sampler moved them (``runtime/host_rngs.py``)
    order: OrderDigest | None = None  # the positions the epoch read, a digest of them
    sampler_seeds: Seeds | None = None  # each DistributedSampler's (seed, epoch)
    # at the epoch's start: its order comes from them (None: not recorded, older state dicts)


@dataclasses.dataclass(frozen=True)
class FirstRead:
    """The RNG states the sampler's first element was read from, where that read came later
    than ``iter(sampler)`` (``runtime/drawing.py``'s ``FirstAtNext``): ``rng`` (the loader's
    generator, else torch's global one), ``sampler_rngs`` (the sampler's own generators),
    ``global_rng`` (torch's global one where ``rng`` is the loader's). A replay sets the epoch's
    states for ``iter(sampler)`` (a sampler drawing its order in ``__iter__`` draws there),
    then these for the first read (one drawing lazily draws there)."""

    rng: torch.Tensor
    sampler_rngs: tuple[torch.Tensor, ...] = ()
    global_rng: torch.Tensor | None = None
    host_rngs: host_rngs.HostRngs | None = None  # Python's and NumPy's, where the read moved them


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """A decoded, validated state dict."""

    epoch: int
    in_epoch: bool
    origin: EpochOrigin | None
    delivered: Bitmap
    generator_state: torch.Tensor | None
    persistent_base_seed: int | None
    steps: tuple[str, ...] | None = None  # the step order the saved epoch ran, or between
    # epochs the one the next runs (None: unknown; before SCHEMA 2)
    order_phase: str | None = None  # AutoOrder's phase with that order (planner/order.py;
    # None: not recorded, state dicts saved before it was)
    sampler_generator_states: tuple[torch.Tensor, ...] = ()  # their states when saved
    empty_batches: int = 0  # a batch sampler's empty batches the saved epoch delivered
    batches: int = 0  # batches the saved epoch delivered (0: before its first, or unknown: not
    # recorded, or counted in another batch_size or drop_last than this loader's)
    positions_read: int | None = None  # positions the saved epoch had read from its sampler
    # (None: not recorded); more than its __len__ says: that length does not end it (span.covers)
    last_batch: tuple[int, ...] | None = None  # delivered-bitmap keys of the last batch the
    # saved epoch delivered: what a DDP rank owing padding repeats (runtime/padding.py)


def build(
    ident: Identity,
    epoch: int,
    origin: EpochOrigin | None,
    delivered: Bitmap | None,
    generator: torch.Generator | None,
    persistent_base_seed: int | None,
    sampler_generators: tuple[torch.Generator, ...] = (),
    empty_batches: int = 0,
    batches: int = 0,
    order_phase: str | None = None,
    positions_read: int | None = None,
    last_batch: Sequence[int] | None = None,
) -> dict[str, Any]:
    in_epoch = origin is not None
    return {
        "schema_version": SCHEMA_VERSION if ident.delivered_by == "position" else BY_INDEX_VERSION,
        "samples": ident.samples,
        "batches_per_epoch": ident.batches,
        # (optional keys, read where present: a state dict without them still loads)
        "epoch_samples": ident.positions,
        "batch_size": ident.batch_size,
        "drop_last": ident.drop_last,
        "shuffle": ident.shuffle,
        "dataset": ident.dataset,
        "steps": list(ident.steps),
        "order_phase": order_phase,  # AutoOrder's phase with that order (planner/order.py)
        "step_code": dict(ident.step_code),
        "identity_version": state_checks.IDENTITY_VERSION,  # how those two were computed
        "epoch": epoch,
        "in_epoch": in_epoch,
        "epoch_rng": rng_to_str(origin.rng) if origin else None,
        "base_seed": origin.base_seed if origin else None,
        "drew_base_seed": origin.drew_base_seed if origin else None,
        "delivered": delivered.to_str() if in_epoch and delivered is not None else None,
        "delivered_by": ident.delivered_by,
        "delivered_count": delivered.count if in_epoch and delivered is not None else 0,
        "generator_state": rng_to_str(generator.get_state()) if generator is not None else None,
        "persistent_base_seed": persistent_base_seed,
        # a sampler's own generator (RandomSampler(generator=g)): its state at the saved epoch's
        # start replays that epoch's order; its state now, the epochs after a finished one
        "epoch_sampler_rngs": [rng_to_str(r) for r in origin.sampler_rngs] if origin else [],
        "epoch_global_rng": (rng_to_str(origin.global_rng)
                             if origin and origin.global_rng is not None else None),
        "epoch_first_read": _first_read_to_dict(origin.first_read if origin else None),
        "epoch_host_rngs": host_rngs.to_dict(origin.host_rngs) if origin else None,
        # each DistributedSampler's [seed, epoch] the epoch's order was drawn with: a replay
        # draws it with them whatever the resumed run's (``runtime/sampler_seeds.py``)
        "epoch_sampler_seeds": sampler_seeds.to_list(origin.sampler_seeds) if origin else None,
        # positions the epoch read and a digest of their indices: a replay compares its own
        "order_digest": _order_to(origin, delivered, ident),
        "sampler_generator_states": [rng_to_str(g.get_state()) for g in sampler_generators],
        # empty batches (a batch sampler's []) have no position: the saved epoch's count of them
        "empty_batches_delivered": empty_batches if in_epoch else 0,
        # batches the saved epoch delivered: DDP ranks padding a resumed epoch to the batch
        # count every rank takes (``distributed.EvenBatches``) count those too
        "batches_delivered": batches if in_epoch else 0,
        # positions the saved epoch had read from its sampler: past what the sampler's __len__
        # says, the epoch goes on past it, whatever was delivered (``span.covers``)
        "positions_read": positions_read if in_epoch else None,
        # the keys of its last batch delivered, where a DDP rank pads its epochs: the batch it
        # repeats if it still owes padding and delivers nothing more (runtime/padding.py)
        "last_batch": ([int(k) for k in last_batch]
                       if in_epoch and last_batch is not None else None),
    }


def parse(sd: dict[str, Any], ident: Identity) -> ResumePoint:
    """Validate a state dict against this loader: raise StateDictError when a resume would
    deliver other samples, warn (``UserWarning``) when only the dataset's identity, the steps'
    code or the batch settings changed."""
    if not isinstance(sd, dict) or "schema_version" not in sd:
        raise StateDictError("not a headrace DataLoader state dict (no schema_version)")
    if sd["schema_version"] not in READABLE_VERSIONS:
        raise StateDictError(
            f"state dict schema_version {sd['schema_version']} is not supported by this headrace "
            f"(reads {', '.join(map(str, READABLE_VERSIONS))}); resume with the headrace version "
            "that saved it"
        )
    if "samples" in sd and sd["samples"] != ident.samples:
        raise StateDictError(
            f"state dict was saved for a dataset of {sd['samples']} samples, this loader's has "
            f"{ident.samples}: a resume would deliver other samples. Use the dataset of the run "
            "that saved it"
        )
    state_checks.check_positions(sd, ident)
    saved_by = sd.get("delivered_by", "position")
    if sd.get("in_epoch") and saved_by != ident.delivered_by:
        raise StateDictError(
            f"state dict records delivered samples by {saved_by}, this loader by "
            f"{ident.delivered_by}: it was saved with{'' if saved_by == 'index' else 'out'} "
            "ODS (Cache(ods=True)) and this loader runs with"
            f"{'' if ident.delivered_by == 'index' else 'out'} it; resume with the same Cache")
    state_checks.check_order(sd, ident)
    code, settings = state_checks.code_changes(sd, ident), state_checks.setting_changes(sd, ident)
    if code or settings:
        what = " and ".join((["by other code"] if code else [])
                            + (["with other settings"] if settings else []))
        warn(
            f"headrace: resuming a state dict saved {what} (" + "; ".join(code + settings)
            + "). Positions and seeds are restored"
            + ("; samples whose steps changed will differ from the saved run's" if code else "")
            + (("; the samples the saved epoch had left come, grouped into batches as this "
                "loader's settings say" if sd["in_epoch"] else "; the next epochs run with this "
                "loader's settings") if settings else ""))
    origin = None
    if sd["in_epoch"]:
        glob = sd.get("epoch_global_rng")
        origin = EpochOrigin(sd["epoch"], rng_from_str(sd["epoch_rng"]), int(sd["base_seed"]),
                             bool(sd["drew_base_seed"]),
                             tuple(map(rng_from_str, sd.get("epoch_sampler_rngs") or ())),
                             rng_from_str(glob) if glob is not None else None,
                             _first_read_from_dict(sd.get("epoch_first_read")),
                             host_rngs.from_dict(sd.get("epoch_host_rngs")),
                             _order_from(sd.get("order_digest")),
                             sampler_seeds.from_list(sd.get("epoch_sampler_seeds")))
    gen = sd.get("generator_state")
    steps = sd.get("steps")
    return ResumePoint(
        epoch=int(sd["epoch"]),
        in_epoch=bool(sd["in_epoch"]),
        origin=origin,
        delivered=Bitmap.from_str(sd["delivered"]) if sd["in_epoch"] else Bitmap(),
        generator_state=rng_from_str(gen) if gen else None,
        persistent_base_seed=sd.get("persistent_base_seed"),
        steps=tuple(steps) if steps is not None else None,
        order_phase=sd.get("order_phase"),
        sampler_generator_states=tuple(map(rng_from_str, sd.get("sampler_generator_states") or ())),
        empty_batches=int(sd.get("empty_batches_delivered") or 0),
        batches=(int(sd.get("batches_delivered") or 0)
                 if (sd.get("batch_size"), sd.get("drop_last", False))
                 == (ident.batch_size, ident.drop_last) else 0),
        positions_read=(int(sd["positions_read"]) if sd.get("in_epoch")
                        and sd.get("positions_read") is not None else None),
        last_batch=(tuple(int(k) for k in sd["last_batch"]) if sd.get("in_epoch")
                    and sd.get("last_batch") is not None else None),
    )


def epoch_over(point: ResumePoint) -> ResumePoint:
    """``point`` as a state between its epoch and the next: what a state taken mid-epoch
    describes once the training loop is known to have ended that epoch there (Lightning's
    ``limit_train_batches``: ``runtime/lightning_loops.py``). The generators' states it
    recorded are those the next epoch draws from, as that epoch's ``iter()`` would have. The
    step order that epoch ran and AutoOrder's phase with it are kept: the next epoch runs that
    order and AutoOrder goes on from that phase (they were dropped: the resumed run went back
    to the declared order and decided again, where the uninterrupted one kept its order)."""
    return dataclasses.replace(point, epoch=point.epoch + 1, in_epoch=False, origin=None,
                               delivered=Bitmap(), empty_batches=0, batches=0,
                               positions_read=None, last_batch=None)


def _order_to(origin: EpochOrigin | None, delivered: Bitmap | None,
              ident: Identity) -> list[int] | None:
    """What a replay compares its order with: the digest of the positions read up to the last
    delivered one (``runtime/order_digest.py``); None where nothing of the epoch was delivered
    by position (under ODS the delivered bitmap is over sample indices: no order to keep)."""
    order = origin.order if origin is not None else None
    if order is None or delivered is None or ident.delivered_by != "position":
        return None
    saved = order.saved(delivered.end())
    return list(saved) if saved is not None else None


def _order_from(saved: Any) -> OrderDigest | None:
    """An ``OrderDigest`` expecting a state dict's ``order_digest`` (None without one)."""
    return OrderDigest((int(saved[0]), int(saved[1]))) if saved else None


def _first_read_to_dict(fr: FirstRead | None) -> dict[str, Any] | None:
    if fr is None:
        return None
    return {"rng": rng_to_str(fr.rng), "sampler_rngs": [rng_to_str(r) for r in fr.sampler_rngs],
            "global_rng": rng_to_str(fr.global_rng) if fr.global_rng is not None else None,
            "host_rngs": host_rngs.to_dict(fr.host_rngs)}


def _first_read_from_dict(d: dict[str, Any] | None) -> FirstRead | None:
    """A state dict's ``epoch_first_read`` (absent in those saved before it: None)."""
    if not d:
        return None
    glob = d.get("global_rng")
    return FirstRead(rng_from_str(d["rng"]), tuple(map(rng_from_str, d.get("sampler_rngs") or ())),
                     rng_from_str(glob) if glob is not None else None,
                     host_rngs.from_dict(d.get("host_rngs")))
