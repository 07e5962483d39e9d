"""``headrace cachebench``: the sample cache (Seneca) against torch, epochs 2+ on imagenet.

Rows, all on the imagenet workload with the same worker budget, each measured over epochs
``2..epochs`` (epoch 1 fills the cache), consuming batches as fast as they come (no simulated
accelerator: this measures the input pipeline):

* ``torch`` : torch's DataLoader, best of a small sweep (prefetch 2 and 4, persistent workers);
* ``headrace, no cache``;
* ``headrace, decoded set fits`` : a memory cache sized for the whole decoded set;
* ``headrace, 20% fits`` : a memory cache holding 20% of the decoded set (MDP splits it);
* ``MDP split ...`` : the 20% budget forced to single-form and mixed splits, the measured
  throughput beside MDP's prediction for that split (Equation 9 on this run's profile);
* ``3 torch jobs``, ``3 headrace jobs, Redis 20%`` and ``3 headrace jobs, Redis 20%, ODS`` :
  three concurrent jobs (separate processes) sharing one Redis cache holding 20% of the
  decoded set (flushed between rows), aggregate throughput and mean hit rate. Without ODS
  the jobs share entries but a miss stays a miss; with ODS (``Cache(ods=True)``, Seneca
  §5.2) a miss is replaced by a cached sample the job has not seen this epoch, and an entry is
  evicted once all three used it, freeing room for the next sample a job computes. Seneca
  reports 54% hit rate with 20% cached by three jobs. Those rows run in
  :mod:`headrace.bench.cache_jobs`, which names a crashed job and leaves its round out.

Writes ``cache_results.json`` and ``cache_results.md``. Never run as a test (timings).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from headrace.bench.cache_jobs import concurrent_rows, crash_line

SPLITS = ({"encoded": 1.0}, {"decoded": 1.0}, {"encoded": 0.5, "decoded": 0.5})
"""Splits of the 20% budget measured beside MDP's prediction."""


def _workload(samples: int, workers: int, cache_dir: str | None) -> Any:
    from headrace.workloads.images import imagenet_workload

    return imagenet_workload(num_samples=samples, num_workers=workers, cache_dir=cache_dir)


def _epochs(loader: Any, epochs: int) -> list[float]:
    """Samples/s of each epoch."""
    rates = []
    for _ in range(epochs):
        t0, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch["index"])
        rates.append(n / (time.perf_counter() - t0))
    return rates


def torch_row(w: Any, epochs: int) -> dict[str, Any]:
    import torch.utils.data as tud

    best: dict[str, Any] = {}
    for pf in (2, 4):
        loader = tud.DataLoader(w.pipeline, batch_size=w.batch_size, shuffle=True,
                                num_workers=w.num_workers, prefetch_factor=pf,
                                persistent_workers=True)
        rates = _epochs(loader, epochs)
        del loader
        later = float(np.mean(rates[1:]))
        if not best or later > best["samples_per_s"]:
            best = {"row": f"torch (prefetch {pf}, persistent)", "samples_per_s": later,
                    "epochs": rates}
    return best


def decoded_bytes(w: Any, probe: int = 16) -> float:
    """Mean bytes of a sample's decoded form (first ``probe`` samples, raw format)."""
    from headrace.cache import codec
    from headrace.cache.tiers import TierLayout
    from headrace.pipeline.runner import SampleRunner

    lay = TierLayout.for_pipeline(w.pipeline)
    pos = (lay.get("decoded") or lay.get("encoded")).position  # type: ignore[union-attr]
    runner, sizes = SampleRunner(w.pipeline), []

    def stop_after_form(next_step: int, _spent: float) -> bool:
        return next_step > pos

    for i in range(min(probe, len(w))):
        out = runner.run(i, 0, None, 0, 0, hand_off=stop_after_form)
        sizes.append(len(codec.encode(out.value)))
    return float(np.mean(sizes))


def mdp_params(session: Any, profile: Any, samples: int, workers: int) -> Any:
    """MDP's inputs for a row's prediction (``planner.cache_partition.DsiParams``; None
    until every step was measured): the session's budget, and B_cache as the plan measures
    it, at the bytes of the largest form the row's split caches (``session.cache_bandwidth``:
    a sample's size; measured without one, a Redis probe read 4 KiB values, whose round trips
    made B_cache a fraction of what the run's samples get)."""
    from headrace.planner.cache_partition import INF, largest_form, params_from_profile

    params = params_from_profile(profile, samples,
                                 {t.name: t.position for t in session.layout.tiers},
                                 workers, session.budget, INF)
    if params is None:
        return None
    forms = [f for f, share in session.split.items() if share > 0] or [
        "encoded", "decoded", "augmented"]
    return dataclasses.replace(params, b_cache=session.cache_bandwidth(largest_form(params, forms)))


def headrace_row(w: Any, epochs: int, label: str, cache: Any) -> dict[str, Any]:
    import headrace as hr
    from headrace.planner.cache_partition import dsi_overall

    loader: hr.DataLoader[Any] = hr.DataLoader(
        w.pipeline, batch_size=w.batch_size, shuffle=True, num_workers=w.num_workers,
        persistent_workers=True, options=hr.Options(seed=0, cache=cache))
    rates = _epochs(loader, epochs)
    row: dict[str, Any] = {"row": label, "samples_per_s": float(np.mean(rates[1:])),
                           "epochs": rates}
    st = loader.stats().epochs
    if cache is not None and st[-1].cache is not None:
        c = st[-1].cache
        later = [e.cache for e in st[1:] if e.cache is not None]
        row["hit_rate"] = (sum(x.hits for x in later) / max(1, sum(x.lookups for x in later))
                           if later else c.hit_rate)  # epochs 2+, as the throughput
        row["hits_by_tier"] = c.hits_by_tier
        row["substituted"] = sum(x.substituted for x in later)
        session = loader.cache
        assert session is not None and session.layout is not None
        prof = loader.planning.profile() if loader.planning else None
        if prof is not None:
            params = mdp_params(session, prof, len(w), w.num_workers)
            if params is not None:
                x = session.split
                row["split"] = x
                row["mdp_predicted"] = dsi_overall(params, x.get("encoded", 0.0),
                                                   x.get("decoded", 0.0), x.get("augmented", 0.0))
    loader.close()
    return row


def _start_redis() -> tuple[Any, str]:
    import shutil
    import socket

    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server is not installed; pass --redis URL or skip with --no-redis")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = tempfile.mkdtemp(prefix="hr-bench-redis-")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    import redis

    r = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            r.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)  # waiting for a server we started; bounded
    return proc, f"redis://127.0.0.1:{port}/0"


def check_arguments(samples: int, workers: int, epochs: int, rounds: int) -> None:
    """Raise ValueError naming the first argument :func:`run` cannot measure with."""
    for name, value, low in (("epochs", epochs, 2), ("samples", samples, 1),
                             ("workers", workers, 1), ("rounds", rounds, 1)):
        if value < low:
            why = " (epoch 1 only fills the cache; rows measure epochs 2+)" if low == 2 else ""
            raise ValueError(f"{name} must be at least {low}, got {value}{why}")


def run(out_dir: str, samples: int, workers: int, epochs: int, redis_url: str | None,
        use_redis: bool, cache_dir: str | None, log: Any = print,
        jobs_only: bool = False, rounds: int = 1) -> dict[str, Any]:
    """Every row (``jobs_only``: only the three-job rows, which need ``use_redis``; those run
    ``rounds`` times, interleaved).

    Raises ValueError before any row runs when ``epochs`` is below 2 (epoch 1 only fills the
    cache, so a row's samples/s, the mean of epochs 2 and later, would be NaN) or ``samples``,
    ``workers`` or ``rounds`` is below 1."""
    import headrace as hr

    check_arguments(samples, workers, epochs, rounds)
    w = _workload(samples, workers, cache_dir)
    dec = decoded_bytes(w)
    full = dec * len(w) * 1.3 + (1 << 20)  # entries, page rounding, headers
    part = 0.2 * dec * len(w)
    rows: list[dict[str, Any]] = []
    if not jobs_only:
        rows.append(torch_row(w, epochs))
        log(f"torch: {rows[-1]['samples_per_s']:.0f} samples/s")
        for label, cache in (("headrace, no cache", None),
                             ("headrace, decoded set fits", hr.Cache(budget_bytes=int(full))),
                             ("headrace, 20% of decoded set", hr.Cache(budget_bytes=int(part)))):
            rows.append(headrace_row(w, epochs, label, cache))
            log(f"{label}: {rows[-1]['samples_per_s']:.0f} samples/s")
        for split in SPLITS:
            rows.append(headrace_row(w, epochs, f"MDP check, 20%, split {split}",
                                     hr.Cache(budget_bytes=int(part), split=split)))
            log(f"{rows[-1]['row']}: {rows[-1]['samples_per_s']:.0f} samples/s")
    if use_redis:
        proc, url = (None, redis_url) if redis_url else _start_redis()
        try:
            rows += concurrent_rows(samples, workers, epochs, url, part, cache_dir, rounds)
            for r in rows:
                for c in r.get("crashed", []):
                    log(f"{r['row']}: {crash_line(c)}")
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
    pairs = [(r["mdp_predicted"], r["samples_per_s"]) for r in rows if "mdp_predicted" in r]
    corr = None
    if len(pairs) >= 3:
        pred, meas = np.array([p for p, _ in pairs]), np.array([m for _, m in pairs])
        corr = float(np.corrcoef(pred, meas)[0, 1])
    result = {"samples": len(w), "workers": workers, "epochs": epochs,
              "decoded_bytes_per_sample": dec, "rows": rows, "mdp_correlation": corr}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cache_results.json").write_text(json.dumps(result, indent=2))
    (out / "cache_results.md").write_text(markdown(result))
    return result


def _ratio(rate: float | None, base: float | None) -> str:
    return f"{rate / base:.2f}x" if rate is not None and base else "-"


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    torch_rate = rows[0]["samples_per_s"]
    lines = [f"imagenet, {result['samples']} samples, {result['workers']} workers, epochs 2-"
             f"{result['epochs']} (epoch 1 fills the cache); input pipeline only", "",
             "| row | samples/s (epochs 2+) | vs torch | hit rate | MDP predicted |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        rate = "crashed" if r["samples_per_s"] is None else f"{r['samples_per_s']:.0f}"
        hit = f"{100 * r['hit_rate']:.0f}%" if "hit_rate" in r else "-"
        pred = f"{r['mdp_predicted']:.0f}" if "mdp_predicted" in r else "-"
        lines.append(f"| {r['row']} | {rate} | {_ratio(r['samples_per_s'], torch_rate)} | "
                     f"{hit} | {pred} |")
    jobs = {r["row"]: r for r in rows if r["row"].startswith("3 ")}
    base = jobs.get("3 torch jobs")
    if base:
        lines.append("\n3-job rows: samples/s is the three jobs' sum (aggregate throughput); "
                     "hit rate their mean over epochs 2+; a round with a crashed job is left "
                     "out.")
        for name, r in jobs.items():
            per_round = ", ".join(f"{x:.0f}" for x in r.get("rounds_samples_per_s", []))
            if r is not base and r["samples_per_s"] is not None:
                lines.append(f"- {name}: {_ratio(r['samples_per_s'], base['samples_per_s'])} "
                             f"the three torch jobs' aggregate, hit rate "
                             f"{100 * r.get('hit_rate', 0.0):.0f}%, "
                             f"{r.get('substituted', 0)} samples substituted by ODS"
                             + (f"; rounds: {per_round} samples/s" if per_round else ""))
            elif per_round:
                lines.append(f"- {name}: rounds {per_round} samples/s")
            lines += [f"- {name}: {crash_line(c)}" for c in r.get("crashed", [])]
    if result["mdp_correlation"] is not None:
        lines.append(f"\nMDP predicted vs measured, correlation over the rows with a prediction: "
                     f"{result['mdp_correlation']:.2f}")
    return "\n".join(lines) + "\n"
