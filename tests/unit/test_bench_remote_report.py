"""The remote benchmark's report names a failed row and keeps the rows that were measured
(its harness writes after every row; the Ray run itself is ``--tiny`` on a real cluster)."""

from __future__ import annotations

import json

from headrace.bench.remote_report import markdown, write


def _results() -> dict:
    return {
        "setup": "96 samples",
        "cluster_restarts": 1,
        "scaling": [
            {"loader": "headrace, 1 local worker", "remote": 0, "samples_per_s": 46.0,
             "accelerator_bound": 400.0},
            {"loader": "headrace, 1 local + 8 remote", "error": "RaySystemError: raylet died",
             "cluster_restarted": True},
        ],
        "autoplace": {"error": "RuntimeError: not placed"},
        "decisions": [{"variant": "CPU-bound", "offload": True, "split": [0, 2], "ratio": 0.5,
                       "gthp": 100.0, "lthp": 40.0, "remote_workers": 2}],
        "unfinished": ["slow_lane"],
    }


def test_markdown_names_the_failed_rows_and_keeps_the_measured_ones() -> None:
    md = markdown(_results())
    assert "| headrace, 1 local worker | 0 | 46.0 | 400.0 |" in md
    assert "| headrace, 1 local + 8 remote | **failed**: RaySystemError: raylet died |" in md
    assert "AutoPlacement: **failed**: RuntimeError: not placed" in md
    assert "| CPU-bound | yes | [0, 2] | 0.50 | 100.0 | 40.0 | 2 |" in md
    assert "replaced 1 time(s)" in md
    assert "Not run (the harness stopped before them): slow_lane." in md


def test_autoplace_says_where_it_converged_and_where_it_ended() -> None:
    res = _results()
    res["autoplace"] = {"samples_per_s": 90.0, "moves": [], "final": {
        "local": 1, "remote": 7, "phase": "remove_remote", "bpt": 0.0678,
        "converged": [1, 8]}}
    md = markdown(res)
    assert "Last converged to 1 local + 8 remote worker(s)." in md
    assert ("In phase remove_remote at the end, at 1 local + 7 remote worker(s), window batch "
            "time 67.8 ms.") in md
    res["autoplace"]["final"].update(phase="add_remote", converged=None)
    md = markdown(res)
    assert "Never converged." in md and "In phase add_remote at the end" in md


def test_write_leaves_json_and_markdown(tmp_path) -> None:
    res = _results()
    write(tmp_path, res)
    assert json.loads((tmp_path / "results.json").read_text())["scaling"][1]["error"] \
        == "RaySystemError: raylet died"
    assert (tmp_path / "results.md").read_text() == markdown(res)
    assert not (tmp_path / "results.json.tmp").exists()
