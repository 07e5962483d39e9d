from headrace import units


def test_durations_pick_their_unit_and_infinity_reads_inf():
    assert units.duration(2.5) == "2.50 s"
    assert units.duration(0.007) == "7.0 ms"
    assert units.duration(0.00012) == "120 µs"
    assert units.duration(float("inf")) == "inf"
    assert units.duration(float("nan")) == "inf"


def test_sizes_use_decimal_units():
    assert units.size(2_300_000) == "2.3 MB"
    assert units.size(1000) == "1.0 KB"
    assert units.size(250) == "250 B"
    assert units.size(3e9) == "3.0 GB"
