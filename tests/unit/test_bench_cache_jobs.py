"""cachebench's three-job rows when a job crashes (bench/cache_jobs.py): the crashed job is
named with its round and why, and its round is left out of every number."""

import pytest

from headrace.bench.cache import markdown
from headrace.bench.cache_jobs import job_outcome, round_result, summarise_rounds
from headrace.cli import crashed_status


def _job(rate: float, hit: float | None) -> tuple[dict, None]:
    row = {"row": "job", "samples_per_s": rate, "epochs": [rate, rate]}
    if hit is not None:
        row |= {"hit_rate": hit, "substituted": 2}
    return row, None


TRACEBACK = """Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/src/headrace/bench/cache_jobs.py", line 151, in <module>
KeyError: 'hit_rate'
"""
"""What a job that crashed wrote on stderr (Python's traceback of an uncaught exception)."""


def _crash() -> tuple[None, str]:
    return job_outcome("headrace", 1, "", TRACEBACK)


def test_a_crashed_job_is_named_with_why_and_left_out_of_the_numbers():
    assert _crash() == (None, "exit code 1: KeyError: 'hit_rate'")
    runs = {"torch": [round_result("torch", [_job(100, None)] * 3, 5.0)] * 2,
            "headrace": [round_result("headrace", [_job(120, 0.2)] * 3, 5.0),
                         round_result("headrace", [_job(90, 0.1), _crash(), _job(90, 0.1)], 5.0)],
            "headrace-ods": [round_result("headrace-ods", [_crash()] + [_job(110, 0.4)] * 2, 5.0)
                             ] * 2}
    torch, plain, ods = summarise_rounds(runs)  # it raised KeyError: 'hit_rate'
    assert plain["samples_per_s"] == 360 and plain["rounds_samples_per_s"] == [360]
    assert plain["hit_rate"] == pytest.approx(0.2)  # not the mean of the two jobs that survived round 2
    assert plain["crashed"] == [{"round": 2, "job": 2, "why": "exit code 1: KeyError: 'hit_rate'"}]
    assert ods["samples_per_s"] is None and "hit_rate" not in ods
    assert [(c["round"], c["job"]) for c in ods["crashed"]] == [(1, 1), (2, 1)]
    assert torch["samples_per_s"] == 300 and torch["crashed"] == []
    table = markdown({"samples": 8, "workers": 1, "epochs": 2, "mdp_correlation": None,
                      "rows": [torch, plain, ods]})
    assert "| 3 headrace jobs, Redis 20%, ODS | crashed | - | - | - |" in table
    assert ("- 3 headrace jobs, Redis 20%: round 2, job 2 of 3 crashed (exit code 1: KeyError: "
            "'hit_rate'); that round is left out") in table


def test_a_job_without_a_row_or_a_hit_rate_is_no_number():
    assert job_outcome("torch", -9, "", "") == (None, "killed by signal 9")
    assert job_outcome("torch", 0, "warming up\n", "") == (None, "printed 0 rows, not 1")
    row = 'ROW {"row": "job", "samples_per_s": 50.0}\n'
    assert job_outcome("torch", 0, row, "")[0] == {"row": "job", "samples_per_s": 50.0}
    # a headrace job whose cache was off would have counted as a 0% hit rate
    assert job_outcome("headrace", 0, row, "") == (
        None, "measured no hit rate (the job ran without the cache)")


def test_cachebench_exits_1_when_a_job_crashed():
    whole = {"rows": [{"row": "torch", "samples_per_s": 10.0},
                      {"row": "3 torch jobs", "samples_per_s": 30.0, "crashed": []}]}
    assert crashed_status(whole) == 0
    whole["rows"][1]["crashed"] = [{"round": 1, "job": 2, "why": "killed by SIGKILL"}]
    assert crashed_status(whole) == 1
