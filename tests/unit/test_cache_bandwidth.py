"""B_cache (Seneca MDP's cache bandwidth) from the probe's numbers, and the split it gives."""

from __future__ import annotations

import pytest

from headrace.cache.bandwidth import (
    MAX_READS_PER_ROUND,
    PROBE_MAX_BYTES,
    PROBE_MIN_BYTES,
    PROBE_ROOM_SHARE,
    from_round_trips,
    held_reads,
    probe_footprint,
    probe_room,
    probe_size,
)
from headrace.planner.cache_partition import DsiParams, best_split, dsi_overall

FORMS = ("encoded", "decoded")  # a default loader's forms (augmented is per epoch)


def params(b_cache: float) -> DsiParams:
    """JPEG-like samples (110 KB encoded, 600 KB decoded), 20 GB of cache for 100k samples."""
    return DsiParams(n_total=100_000, cache_bytes=20e9, size_encoded=110e3, size_decoded=600e3,
                     size_augmented=600e3, t_decode_augment=400.0, t_augment=2000.0,
                     b_storage=50e6, b_cache=b_cache)


def test_the_probe_value_is_a_samples_size_within_bounds() -> None:
    assert probe_size(600e3) == 600_000
    assert probe_size(10.0) == PROBE_MIN_BYTES
    assert probe_size(1e12) == PROBE_MAX_BYTES


def test_bandwidth_is_the_median_round_trips() -> None:
    # one slow round trip (a scheduling hiccup) does not set it
    assert from_round_trips(600_000, [0.005, 0.005, 0.5, 0.005, 0.006]) == pytest.approx(120e6)
    with pytest.raises(ValueError):
        from_round_trips(600_000, [])


def test_the_split_follows_the_measured_bandwidth() -> None:
    """A 600 KB value read in 5.13 ms (117 MB/s, a 1 GbE Redis) and one copied at 10 GB/s give
    MDP other splits: the decoded form it picks at memory speed gives 332 samples/s on the
    slow server, where the encoded form it picks there gives 400."""
    slow = from_round_trips(600_000, [600e3 / 117e6] * 5)
    assert slow == pytest.approx(117e6)
    fast = best_split(params(10e9), FORMS)
    right = best_split(params(slow), FORMS)
    assert fast.shares() == {"decoded": 1.0}
    assert right.shares() == {"encoded": 1.0} and right.predicted == pytest.approx(400)
    assert dsi_overall(params(slow), fast.encoded, fast.decoded, 0.0) == pytest.approx(332, abs=1)


def test_the_probe_value_is_written_only_where_redis_cannot_evict_for_it() -> None:
    info = {"maxmemory": 10 << 20, "used_memory": 6 << 20}
    assert probe_room({**info, "maxmemory_policy": "noeviction"}) is None  # refuses instead
    assert probe_room({**info, "maxmemory": 0, "maxmemory_policy": "allkeys-lru"}) is None
    for policy in ("allkeys-lru", "volatile-lru", "allkeys-random"):
        assert probe_room({**info, "maxmemory_policy": policy}) == int((4 << 20) * PROBE_ROOM_SHARE)
    assert probe_room({}) == -1  # INFO refused: unknown, so nothing is written
    assert probe_room({"maxmemory": 1 << 20, "used_memory": 2 << 20,
                       "maxmemory_policy": "allkeys-lru"}) == 0
    # the value twice (query buffer, key) and one round's replies
    assert probe_footprint(1 << 20) == 3 << 20
    assert probe_footprint(4 << 10) == (2 + 64) * (4 << 10)


def test_a_held_entry_is_read_about_the_forms_bytes_a_round_within_the_room() -> None:
    # a round of the 480 KiB form's value reads 2 of them (960 KiB): 10 GETs of a 100 KB
    # entry move as much, 9 where the room holds 9 replies, 1 where the room is unknown
    form = 480 << 10
    assert held_reads(100_000, 10 << 20, form) == 10
    assert held_reads(100_000, 950_000, form) == 9
    assert held_reads(100_000, -1, form) == 1
    assert held_reads(100_000, 50_000, form) == 1  # (an entry over the room is never read)
    assert held_reads(2048, 10 << 20, 1 << 20) == MAX_READS_PER_ROUND
    assert held_reads(4 << 20, 10 << 20, 1 << 20) == 1


def test_a_held_entry_stands_for_a_form_only_with_a_quarter_of_a_probe_round():
    # compared with one probe value, 64 GETs of a 100-byte entry (6.4 KB) stood for a 4 KiB
    # form, whose probe rounds move 256 KiB: a round-trip count, 41x under (a review)
    from headrace.cache.bandwidth import ENTRY_MIN_SHARE, reads_per_round, stands_for

    room = 1 << 30
    assert 4096 * reads_per_round(4096) * ENTRY_MIN_SHARE > 100 * 64
    assert not stands_for(100, room, 4096)
    assert stands_for(100_000, room, 480 << 10)  # a full server of 100 KB entries, 480 KiB forms
    assert not stands_for(2_000, -1, 1 << 20)  # room unknown: one GET a round


def test_the_memory_bandwidth_is_the_fastest_copy() -> None:
    # one copy into a fresh buffer timed its page faults too: 0.8 to 14.6 GB/s from run to run
    # on one machine, and a low reading moves MDP's budget to another form for epoch 2
    from headrace.cache import bandwidth

    assert bandwidth.fastest(32 << 20, [0.040, 0.0025, 0.003]) == (32 << 20) / 0.0025
    assert bandwidth.MEMORY_PROBE_COPIES >= 2
    with pytest.raises(ValueError):
        bandwidth.fastest(1, [])
