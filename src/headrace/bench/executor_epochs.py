"""``executor="auto"`` over several epochs against worker processes (issue 13, item 2).

``headrace bench`` measures each row's first epoch, where ``executor="auto"`` still runs on
worker processes and measures (``runtime/gilprobe.py``); its choice applies from the second
epoch, and threads' first epoch is a trial that can send it back (``planner/executor.py``).
This runs one loader per executor over ``--epochs`` epochs of a workload of the benchmark, with
its simulated accelerator step, and reports every epoch's wall time and what auto decided.

Per round the two loaders (``processes``, ``auto``) run one after the other, alternating which
goes first; cells are median (min-max) over rounds. headrace runs without the sample cache
(``Options(cache=None)``), so every epoch runs every step; each epoch is checked exactly once.

    python -m headrace.bench.executor_epochs --workloads imseg objdet imagenet --rounds 2
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Literal

from headrace.bench.summary import Spread

Executor = Literal["processes", "auto", "threads"]
EXECUTORS: tuple[Executor, ...] = ("processes", "auto")


def epochs(pipeline: Any, executor: Executor, workers: int, n: int, batch_size: int,
           step_s: float = 0.0) -> tuple[list[float], str]:
    """(wall seconds of each of ``n`` epochs of one loader of ``pipeline``, what ``explain()``
    says of the executor: empty when it decided nothing), sleeping ``step_s`` per batch (the
    simulated accelerator step); every epoch is checked exactly once by its sample count."""
    import headrace

    options = headrace.Options(cache=None, profile_store=False, executor=executor)
    loader: Any = headrace.DataLoader(pipeline, batch_size=batch_size, shuffle=True,
                                      num_workers=workers, in_order=False, options=options)
    walls = []
    try:
        for epoch in range(n):
            seen = 0
            t0 = time.perf_counter()
            for batch in loader:
                seen += _samples(batch)
                if step_s:
                    time.sleep(step_s)  # the simulated accelerator step
            walls.append(time.perf_counter() - t0)
            if seen != len(pipeline):
                raise AssertionError(f"{executor}, epoch {epoch}: {seen} of {len(pipeline)}")
        d = loader.monitor.executor_decision
        return walls, d.describe() if d is not None else ""
    finally:
        loader.close()


def _samples(batch: Any) -> int:
    """Samples in ``batch``: a workload's dict (its ``"index"``), a list (its last column, the
    labels), or a tensor."""
    if isinstance(batch, dict):
        return len(batch["index"])
    return len(batch[-1]) if isinstance(batch, list) else len(batch)


def run(workloads: list[str], rounds: int, n: int, workers: int,
        num_samples: int | None = None) -> dict[str, dict[str, Any]]:
    """``{workload: {executor: ([[epoch walls] per round], [decision per round])}}``."""
    from headrace.bench.config import FULL_SCALES
    from headrace.runtime.native_threads import blas_limited
    from headrace.workloads.registry import get_workload

    out: dict[str, dict[str, Any]] = {}
    with blas_limited(1):
        for name in workloads:
            workload = get_workload(name, scale=FULL_SCALES.get(name, 1.0),
                                    num_samples=num_samples)
            res: dict[str, Any] = {ex: ([], []) for ex in EXECUTORS}
            for r in range(rounds):
                for ex in EXECUTORS if r % 2 == 0 else EXECUTORS[::-1]:
                    walls, why = epochs(workload.pipeline, ex, workers, n,
                                        workload.batch_size, workload.accelerator_step_s)
                    res[ex][0].append(walls)
                    res[ex][1].append(why)
            out[name] = res
    return out


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, res in results.items():
        n = len(res[EXECUTORS[0]][0][0])
        lines += [f"**{name}** (wall s per epoch, median (min–max) over "
                  f"{len(res[EXECUTORS[0]][0])} rounds)", "",
                  "| executor | " + " | ".join(f"epoch {e + 1}" for e in range(n)) + " |",
                  "|---|" + "---|" * n]
        for ex, (walls, _) in res.items():
            cells = [Spread.of([w[e] for w in walls]).text(".2f") for e in range(n)]
            lines.append(f"| {ex} | " + " | ".join(cells) + " |")
        lines += ["", *(f"- auto, round {r + 1}: {why}" for r, why in enumerate(res["auto"][1])),
                  ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["imseg", "objdet", "imagenet"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    print(markdown(run(a.workloads, a.rounds, a.epochs, a.workers)))


if __name__ == "__main__":
    main()
