"""The conformance suite runs every test against torch's DataLoader and headrace's.

A test asserts what torch documents; where headrace differs on purpose it asserts the
difference and names it with one of the constants below (the README's "Differences from
torch's DataLoader" lists the same ones, with the reason for each).
"""

from __future__ import annotations

import pytest
import torch.utils.data as tud

import headrace as hr

SAMPLE_AWARE = "sample-aware batching (in_order=None regroups a random order)"
PER_SAMPLE_SEEDING = "per-sample seeding of the global generators in workers"
COLLATE_IN_MAIN = "batches collated in the training process"
REPLACED_ITERATOR = "a replaced persistent iterator raises instead of silently resetting"
TIMEOUT_WITHOUT_WORKERS = "timeout>0 with num_workers=0 warns at iter() where torch raises"
ARGUMENT_TYPES_AT_BUILD = ("num_workers, prefetch_factor or generator of the wrong type raise "
                           "when the loader is built where torch raises at iter()")


@pytest.fixture(params=["torch", "headrace"])
def Loader(request):  # noqa: N802 - it is a class
    """torch's ``DataLoader`` or headrace's (defaults unchanged)."""
    return tud.DataLoader if request.param == "torch" else hr.DataLoader


def is_headrace(loader_cls: type) -> bool:
    return issubclass(loader_cls, hr.DataLoader)


def flat(batches) -> list:
    """Every element of every batch, in delivery order."""
    return [x for b in batches for x in (b.tolist() if hasattr(b, "tolist") else b)]
