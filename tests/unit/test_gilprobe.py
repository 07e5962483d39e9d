"""``runtime/gilprobe.py``'s arithmetic of one probe (pure: no threads)."""

import pytest

from headrace.runtime.gilprobe import probe_times


def test_a_wait_for_a_core_counts_neither_as_probed_nor_as_held():
    # a 0.2 ms sleep that took 8.2 ms: 3 ms runnable without a core, 5 ms waiting for the GIL
    probed, late = probe_times(0.0082, 0.003, 0.0002)
    assert probed == pytest.approx(0.0052) and late == pytest.approx(0.005)
    # counted as probed, the core's 3 ms read a step holding the GIL all along as 61% held
    assert late / probed > 0.95


def test_a_step_releasing_the_gil_reads_as_free_on_a_busy_machine():
    probed, late = probe_times(0.0032, 0.003, 0.0002)  # woke late for a core only
    assert probed == pytest.approx(0.0002) and late == pytest.approx(0.0)
