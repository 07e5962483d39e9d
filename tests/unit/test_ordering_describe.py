"""What explain() says of the batching (``runtime/ordering.py``, pure)."""

from __future__ import annotations

from headrace.runtime.ordering import describe


def test_in_order_says_torchs_batches_only_without_ods():
    assert describe("ordered", True) == "torch's order and batches (in_order=True)"
    # ODS fills positions with other samples: the order of positions is the sampler's, the
    # batches are not torch's (a bug hunt saw 45 substitutions under "torch's batches")
    with_ods = describe("ordered", True, ods=True)
    assert "torch's order and batches" not in with_ods and "ODS" in with_ods
    assert describe("regroup", None, ods=True).startswith("sample-aware")
