"""python -m headrace.bench.ring_memory: it finds every worker's ring and reads what of it is
resident (the rings' span: runtime/ring.py)."""

import pytest

from headrace.bench import ring_memory

pytestmark = pytest.mark.integration


def test_ring_memory_finds_the_rings_and_their_resident_pages(no_leaks, capsys):
    r = ring_memory.measure(workers=2, sample_kb=64, batches=50)
    assert r["rings"] == 2 and r["mapped_mb"] == 32
    assert 0 < r["resident_mb"] < r["mapped_mb"]  # 50 batches of 64 KB samples: a span's worth
    ring_memory.main(["--workers", "1", "--batches", "10"])
    assert "| 1 | 1 |" in capsys.readouterr().out
