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
from typing import Any

import torch

from headrace.errors import StateDictError
from headrace.runtime.bitmap import Bitmap

SCHEMA_VERSION = 1


def rng_to_str(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def rng_from_str(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng(generator: torch.Generator | None) -> torch.Tensor:
    """The state the epoch's draws come from: the loader's generator, else torch's global one."""
    return generator.get_state() if generator is not None else torch.get_rng_state()


@dataclasses.dataclass(frozen=True)
class EpochOrigin:
    """What an epoch's order and seeds were drawn from (kept by each epoch iterator)."""

    epoch: int
    rng: torch.Tensor
    base_seed: int
    drew_base_seed: bool  # False for later epochs of persistent workers (torch draws once)


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """A decoded, validated state dict."""

    epoch: int
    in_epoch: bool
    origin: EpochOrigin | None
    delivered: Bitmap
    generator_state: torch.Tensor | None
    persistent_base_seed: int | None


def build(
    fingerprint: str,
    batches: int,
    epoch: int,
    origin: EpochOrigin | None,
    delivered: Bitmap | None,
    generator: torch.Generator | None,
    persistent_base_seed: int | None,
) -> dict[str, Any]:
    in_epoch = origin is not None
    return {
        "schema_version": SCHEMA_VERSION,
        "dataset_fingerprint": fingerprint,
        "batches_per_epoch": batches,
        "epoch": epoch,
        "in_epoch": in_epoch,
        "epoch_rng": rng_to_str(origin.rng) if origin else None,
        "base_seed": origin.base_seed if origin else None,
        "drew_base_seed": origin.drew_base_seed if origin else None,
        "delivered": delivered.to_str() if in_epoch and delivered is not None else None,
        "delivered_count": delivered.count if in_epoch and delivered is not None else 0,
        "generator_state": rng_to_str(generator.get_state()) if generator is not None else None,
        "persistent_base_seed": persistent_base_seed,
    }


def parse(sd: dict[str, Any], fingerprint: str, batches: int) -> ResumePoint:
    """Validate a state dict against this loader; raise StateDictError saying what differs."""
    if not isinstance(sd, dict) or "schema_version" not in sd:
        raise StateDictError("not a headrace DataLoader state dict (no schema_version)")
    if sd["schema_version"] != SCHEMA_VERSION:
        raise StateDictError(
            f"state dict schema_version {sd['schema_version']} is not supported by this headrace "
            f"(expects {SCHEMA_VERSION}); resume with the headrace version that saved it"
        )
    if sd["dataset_fingerprint"] != fingerprint:
        raise StateDictError(
            f"state dict was saved for dataset/pipeline {sd['dataset_fingerprint']}, this loader "
            f"has {fingerprint}: a resume would deliver other samples. Use the same dataset, "
            "steps and sampler as the run that saved it"
        )
    if sd["batches_per_epoch"] != batches:
        raise StateDictError(
            f"state dict was saved with {sd['batches_per_epoch']} batches per epoch, this loader "
            f"has {batches}: batch_size, drop_last or the sampler differ"
        )
    origin = None
    if sd["in_epoch"]:
        origin = EpochOrigin(sd["epoch"], rng_from_str(sd["epoch_rng"]), int(sd["base_seed"]),
                             bool(sd["drew_base_seed"]))
    gen = sd.get("generator_state")
    return ResumePoint(
        epoch=int(sd["epoch"]),
        in_epoch=bool(sd["in_epoch"]),
        origin=origin,
        delivered=Bitmap.from_str(sd["delivered"]) if sd["in_epoch"] else Bitmap(),
        generator_state=rng_from_str(gen) if gen else None,
        persistent_base_seed=sd.get("persistent_base_seed"),
    )
