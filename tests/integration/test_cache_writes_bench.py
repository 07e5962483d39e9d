"""python -m headrace.bench.cache_writes: every configuration runs, stores every entry it
writes, and prints one row per (writers, shards)."""

from __future__ import annotations

import pytest

from headrace.bench import cache_writes

pytestmark = pytest.mark.integration


def test_every_writer_stores_every_entry_in_any_number_of_shards() -> None:
    for writers, shards in [(1, 1), (2, 3)]:
        assert cache_writes.inserts_per_s(writers, shards, count=12, kb=40) > 0  # raises if
        # an entry was refused or counted wrong


def test_the_table_has_a_row_per_configuration(capsys) -> None:
    cache_writes.main(["--writers", "1", "2", "--shards", "1", "2", "--count", "5", "--kb", "20",
                       "--rounds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 4  # header and four configurations
    assert rows[1].startswith("| 1 | 1 |") and rows[1].endswith("| 1.00x |")
