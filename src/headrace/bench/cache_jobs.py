"""The three concurrent-job rows of ``headrace cachebench`` (:mod:`headrace.bench.cache`):
three jobs of one kind (torch; headrace on a shared Redis cache; the same with ODS) run at once
as separate processes, a round at a time; a round whose three jobs all completed gives the
kind's aggregate samples/s and mean hit rate, a crashed job is named with its round and why,
and its round is left out of the numbers. Never run as a test (timings).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np


def _job(args: list[str]) -> None:
    """One of the concurrent jobs (run in its own process): prints its row as JSON."""
    from headrace.bench.cache import _workload, headrace_row, torch_row

    samples, workers, epochs, url, budget, kind, cache_dir = args
    w = _workload(int(samples), int(workers), cache_dir or None)
    if kind == "torch":
        row = torch_row(w, int(epochs))
    else:
        import headrace as hr

        row = headrace_row(w, int(epochs), "job", hr.Cache(url=url, budget_bytes=int(float(budget)),
                                                            split={"decoded": 1.0},
                                                            ods=kind == "headrace-ods"))
    print("ROW " + json.dumps(row))


JOB_KINDS = ("torch", "headrace", "headrace-ods")
JOB_LABELS = {"torch": "3 torch jobs", "headrace": "3 headrace jobs, Redis 20%",
              "headrace-ods": "3 headrace jobs, Redis 20%, ODS"}


def concurrent_rows(samples: int, workers: int, epochs: int, url: str, budget: float,
                    cache_dir: str | None, rounds: int = 1) -> list[dict[str, Any]]:
    """The three-job rows, ``rounds`` times each, interleaved (round ``k`` starts ``k`` kinds
    later, so drift of the machine hits every kind alike); summarised by
    :func:`summarise_rounds`."""
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in JOB_KINDS}
    for k in range(rounds):
        for kind in JOB_KINDS[k % len(JOB_KINDS):] + JOB_KINDS[:k % len(JOB_KINDS)]:
            runs[kind].append(_concurrent_round(kind, samples, workers, epochs, url, budget,
                                                cache_dir))
    return summarise_rounds(runs)


def summarise_rounds(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per kind of ``runs`` (kind -> its rounds, in order, as :func:`round_result`
    returns them). A row's samples/s (the three jobs' sum) and hit rate (their mean) are the
    medians over the rounds whose three jobs all completed, with each such round's values
    beside them; a round with a crashed job is left out of every number (two jobs' sum is no
    three-job aggregate) and listed under ``crashed`` as ``{"round", "job", "why"}`` (both
    counted from 1). When no round of a kind completed, its samples/s is None."""
    out = []
    for kind, rs in runs.items():
        done = [r for r in rs if "crashed" not in r]
        row: dict[str, Any] = {
            "row": JOB_LABELS.get(kind, kind),
            "samples_per_s": (float(np.median([r["samples_per_s"] for r in done]))
                              if done else None),
            "rounds_samples_per_s": [r["samples_per_s"] for r in done],
            "jobs": [r["jobs"] for r in done], "wall_s": [r["wall_s"] for r in done],
            "crashed": [{"round": k + 1, **c} for k, r in enumerate(rs)
                        for c in r.get("crashed", [])]}
        if kind != "torch" and done:
            row["hit_rate"] = float(np.median([r["hit_rate"] for r in done]))
            row["rounds_hit_rate"] = [r["hit_rate"] for r in done]
            row["substituted"] = int(np.median([r["substituted"] for r in done]))
        out.append(row)
    return out


def crash_line(crash: dict[str, Any]) -> str:
    """One crashed job of :func:`summarise_rounds`'s ``crashed``, in words."""
    return (f"round {crash['round']}, job {crash['job']} of 3 crashed ({crash['why']}); "
            "that round is left out")


def job_outcome(kind: str, returncode: int, stdout: str, stderr: str
                ) -> tuple[dict[str, Any] | None, str | None]:
    """A job process's row, or None and why it has none: it exited non-zero (the last line
    of its stderr, the exception for a traceback), was killed by a signal, printed no row,
    or, for a headrace job, measured no hit rate (it ran without the cache)."""
    rows = [json.loads(line[4:]) for line in stdout.splitlines() if line.startswith("ROW ")]
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    if returncode < 0:
        return None, f"killed by signal {-returncode}" + (f": {last}" if last else "")
    if returncode != 0:
        return None, f"exit code {returncode}: {last or 'no error output'}"
    if len(rows) != 1:
        return None, f"printed {len(rows)} rows, not 1"
    if kind != "torch" and "hit_rate" not in rows[0]:
        return None, "measured no hit rate (the job ran without the cache)"
    return rows[0], None


def round_result(kind: str, outcomes: list[tuple[dict[str, Any] | None, str | None]],
                 wall_s: float) -> dict[str, Any]:
    """One round of three jobs from their :func:`job_outcome`: their summed samples/s, mean
    hit rate and summed substitutions, or, when a job has no row, ``crashed``: each such
    job (counted from 1) and why, and no number."""
    crashed = [{"job": j + 1, "why": why} for j, (row, why) in enumerate(outcomes) if row is None]
    if crashed:
        return {"crashed": crashed, "wall_s": wall_s}
    rows = [row for row, _ in outcomes if row is not None]
    out: dict[str, Any] = {"samples_per_s": sum(r["samples_per_s"] for r in rows),
                           "jobs": rows, "wall_s": wall_s}
    if kind != "torch":
        out["hit_rate"] = float(np.mean([r["hit_rate"] for r in rows]))
        out["substituted"] = sum(r.get("substituted", 0) for r in rows)
    return out


def _concurrent_round(kind: str, samples: int, workers: int, epochs: int, url: str,
                      budget: float, cache_dir: str | None) -> dict[str, Any]:
    """Three jobs of ``kind`` at once (separate processes), from an empty cache."""
    if kind != "torch":
        import redis

        redis.Redis.from_url(url).flushdb()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        # stderr to files: a job blocked on a full pipe while another is read would be timed so
        errs = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in range(3)]
        procs = [subprocess.Popen([sys.executable, "-m", "headrace.bench.cache_jobs", "--job",
                                   str(samples), str(workers), str(epochs), url, str(budget),
                                   kind, cache_dir or ""], stdout=subprocess.PIPE, stderr=err,
                                  text=True)
                 for err in errs]
        stdouts = [p.communicate()[0] for p in procs]
        wall_s = time.perf_counter() - t0
        outcomes = []
        for p, stdout, err in zip(procs, stdouts, errs, strict=True):
            err.seek(0)
            stderr = err.read()
            sys.stderr.write(stderr)  # the job's warnings, as when it wrote to the terminal
            outcomes.append(job_outcome(kind, p.returncode, stdout, stderr))
    return round_result(kind, outcomes, wall_s)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--job"]:
        _job(sys.argv[2:])
