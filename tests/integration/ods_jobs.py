"""A training job for the ODS tests, run in its own process (``spawn``): one loader with
``Cache(ods=True)`` on the test's Redis server, epochs of the integration pipeline, results
(indices delivered per epoch, cache numbers, optionally the rows) written as JSON."""

from __future__ import annotations

import dataclasses
import json
import signal
import time
from typing import Any

import torch

import headrace as hr
from tests.integration.test_cache import pipeline

ENTRY = 24 + 3 + 9 * 8 * 4 + 30 + 64 + 32  # key, prefix, floats, header, overhead, ODS (about)
BUDGET = 10 * ENTRY
"""About a fifth of the 48 decoded samples (Seneca's 20%)."""
WAIT_S = 120.0
"""Longest a job waits for its peers (barrier) or to be killed (bounded, never reached)."""


def cache(url: str, job: str | None, ttl_s: float = 60.0, **kw: Any) -> hr.Cache:
    return hr.Cache(url=url, budget_bytes=BUDGET, ods=True, job=job, ods_ttl_s=ttl_s,
                    split={"decoded": 1.0}, **kw)


def loader(url: str, job: str | None, seed: int, workers: int, ttl_s: float = 60.0) -> Any:
    return hr.DataLoader(pipeline(), batch_size=4, shuffle=True, num_workers=workers,
                         options=hr.Options(seed=seed, cache=cache(url, job, ttl_s)))


def run_job(url: str, job: str, seed: int, epochs: int, out: str, start: Any = None,
            workers: int = 1, ttl_s: float = 60.0, stop_after: int | None = None,
            state_path: str | None = None, stopped: Any = None, resume: str | None = None,
            rows: bool = False) -> None:
    """Run ``epochs`` epochs and write ``{"epochs": [{"indices", "cache", "rows"?}]}`` to
    ``out``. ``start``: a barrier the jobs pass together. ``stop_after``: after that many
    batches of the first epoch, save ``state_dict()`` to ``state_path``, write what was
    delivered, set ``stopped`` and wait to be killed. ``resume``: a state dict to load first.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ld = loader(url, job, seed, workers, ttl_s)
    if resume is not None:
        ld.load_state_dict(torch.load(resume))
    if start is not None:
        start.wait(WAIT_S)
    result: list[dict[str, Any]] = []
    for _ in range(epochs):
        got: list[int] = []
        kept: dict[str, list[float]] = {}
        for b, batch in enumerate(ld):
            for row in batch:
                i = int(row[8, 0])
                got.append(i)
                if rows:
                    kept[str(i)] = row.flatten().tolist()
            if stop_after is not None and b + 1 == stop_after:
                assert state_path is not None and stopped is not None
                torch.save(ld.state_dict(), state_path)
                _write(out, [*result, _epoch(got, ld, kept)])
                stopped.set()
                time.sleep(WAIT_S)  # waits to be killed (SIGKILL: nothing runs after)
                raise RuntimeError("not killed")
        result.append(_epoch(got, ld, kept))
    _write(out, result)
    ld.close()


def _epoch(got: list[int], ld: Any, rows: dict[str, list[float]]) -> dict[str, Any]:
    stats = ld.stats()
    c = stats.last.cache if stats.epochs else None
    return {"indices": got, "cache": dataclasses.asdict(c) if c else None, "rows": rows}


def _write(path: str, epochs: list[dict[str, Any]]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump({"epochs": epochs}, f)
    import os

    os.replace(path + ".tmp", path)
