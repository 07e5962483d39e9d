"""python -m headrace.bench.ring_memory: it finds every worker's ring and reads what of it is
resident (the rings' span: runtime/ring.py)."""

import pytest

from headrace.bench import ring_memory
from headrace.runtime.ring import FORK_RING_BYTES

pytestmark = pytest.mark.integration


def test_ring_memory_finds_the_rings_and_their_resident_pages(no_leaks, capsys):
    r = ring_memory.measure(workers=2, sample_kb=64, batches=50)  # this loader's rings only
    assert r["rings"] == 2 and r["mapped_mb"] == 2 * (FORK_RING_BYTES >> 20)
    assert 0 < r["resident_mb"] < r["mapped_mb"]  # 50 batches of 64 KB samples: a span's worth
    ring_memory.main(["--workers", "1", "--batches", "10"])
    assert "| 1 | 1 |" in capsys.readouterr().out


def test_a_large_sample_epoch_is_timed_for_both_loaders(no_leaks):
    # 80 MB leaves: over a quarter of any ring, so this also runs the shared-memory fallback
    for kind in ("headrace", "torch"):
        assert ring_memory.large_epoch_s(kind, sample_mb=80, batch=2, batches=2) > 0


def test_memory_against_torch_runs_each_loader_in_a_fresh_process(capsys):
    ring_memory.main(["--rss-mb", "1", "--samples", "8", "--epochs", "1", "--rounds", "1"])
    out = capsys.readouterr().out
    assert "| headrace | " in out and "| torch | " in out and "8 samples of 1 MB" in out
