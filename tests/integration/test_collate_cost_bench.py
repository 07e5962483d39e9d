"""The collate_fn benchmark runs (a tiny form; its timings mean nothing here)."""

import pytest

from headrace.bench import collate_cost

pytestmark = pytest.mark.integration


def test_collate_cost_runs_every_loader_over_every_sample(no_leaks, capsys):
    times = collate_cost.run(workers=1, rounds=2, samples=10, batch=4, sample_ms=0.0,
                             collate_ms=1.0, work="cpu")  # run() checks each delivered 10
    assert set(times) == {"torch", "headrace in_order=True", "headrace default",
                          "headrace 4 collate threads"}
    assert all(len(ts) == 2 and all(t > 0 for t in ts) for ts in times.values())
    collate_cost.main(["--workers", "1", "--rounds", "1", "--samples", "8", "--batch", "4",
                       "--sample-ms", "0", "--collate-ms", "0"])
    assert "x torch" in capsys.readouterr().out
