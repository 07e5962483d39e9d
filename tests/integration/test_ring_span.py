"""A worker's ring (runtime/ring.py) keeps resident what its samples in flight need, with
large samples too: 20 MB samples made 180-240 MB of each 256 MB ring resident (the writer went
back to the ring's start behind a pad that a consumer one sample behind had not freed, and
the span grew to the whole ring)."""

import pytest

from headrace.bench.ring_memory import _Samples, ring_pages
from headrace.runtime import DataLoader, Options

pytestmark = pytest.mark.integration

SAMPLE_MB = 20


@pytest.mark.parametrize("profile", [True, False])  # unprofiled, no size is measured: the
# cap on the bytes queued reads the sample's bytes in the ring (a review)
def test_rings_of_large_samples_keep_a_few_samples_resident(profile, no_leaks):
    # A worker is given two samples at a time here (their steps take about 2 ms, and samples
    # of 20 MB are queued no deeper than that: ``queueing.QUEUE_BYTES``; on a machine where
    # they took 1.5-2 ms, three at a time kept 240 MB resident), so its ring holds one sample
    # not yet copied out while it writes the next: two samples' room, and a span, a power of
    # two over that, under four samples (64 MB for 20 MB samples). The whole ring is 256 MB.
    before = ring_pages()
    loader = DataLoader(_Samples(120, SAMPLE_MB << 18), batch_size=4, num_workers=2,
                        persistent_workers=True, shuffle=True, timeout=120,
                        options=Options(profile=profile))
    try:
        for _ in range(2):
            assert sum(len(b) for b in loader) == 120
        rings, resident_mb, _ = (a - b for a, b in zip(ring_pages(), before, strict=True))
    finally:
        loader.close()
    assert rings == 2
    assert resident_mb <= rings * 4 * SAMPLE_MB, f"{resident_mb} MB of the rings resident"
