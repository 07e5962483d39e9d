"""Remote workers benchmark: ``python -m headrace.bench.remote --out bench-remote``.

One run, side by side, on a Ray cluster (a local multi-node one by default: a head node with
no CPUs for actors, and ``--nodes`` CPU nodes of ``--node-cpus`` slots each):

1. **Scaling**: a workload whose per-sample work is mostly simulated CPU time (a sleep, so
   that more Ray workers add real capacity even on a 2-core machine) with 1 local worker and a
   simulated accelerator (``--model-ms`` per batch): samples/s of torch's DataLoader, headrace
   local-only, and headrace with 1, 2, 4, ... remote workers, against the accelerator bound.
2. **AutoPlacement** (Pecan): ``Remote(autoplace=True)`` with costs, several epochs; the
   timeline of local and remote workers and batch time is plotted (Pecan Figure 7 style).
3. **FastFlow's decision table** for a CPU-bound, an I/O-bound (large samples over a
   ``--bandwidth`` link) and a GPU-bound variant: offload or not, split, ratio, the numbers.
4. **Slow lane to remote**: a heavy-tailed pipeline with ``Remote(slow_lane=False)`` vs
   ``True``: does finishing handed-off samples on remote workers pay?

Every headrace loader here runs without the sample cache (``Options(cache=None)``): the
simulated work must be done again every epoch, as torch does it, or the local-only row is
served from memory after its warm-up epoch. Writes ``results.json``, ``results.md`` and
``autoplace-timeline.png`` to ``--out``, after every row: a row or section that fails is
recorded with its error (a Ray cluster that lost a node is replaced, ``bench/ray_cluster.py``)
and the others still run; the exit status is 1 when one failed. Timings must come from a quiet
machine; ``--tiny`` only proves that the harness runs.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import headrace as hr
from headrace.bench.ray_cluster import BenchCluster
from headrace.bench.remote_report import markdown, write

log = logging.getLogger("headrace")


class SimSource:
    """``n`` samples of ``kb`` KiB each; loading one sleeps ``work_ms`` (simulated CPU work)."""

    def __init__(self, n: int, work_ms: float, kb: int = 4) -> None:
        self.n, self.work_ms, self.kb = n, work_ms, kb

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> np.ndarray:
        time.sleep(self.work_ms / 1000.0)
        return np.full(self.kb * 256, i, dtype=np.float32)


def augment(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A little real CPU work (and a random draw), after the simulated work."""
    return x + rng.random(1).astype(np.float32)


class TorchSim(torch.utils.data.Dataset):
    """The same samples for torch's DataLoader."""

    def __init__(self, src: SimSource) -> None:
        self.src = src

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> np.ndarray:
        return augment(self.src.load(i), np.random.default_rng(i))


def heavy_tail(x: np.ndarray) -> np.ndarray:
    """150 ms of simulated work on one sample in 8 (by its value), none on the others."""
    if int(x[0]) % 8 == 0:
        time.sleep(0.15)
    return x


def heavy_tail_then_light(x: np.ndarray) -> np.ndarray:
    """150 ms on one sample in 8, 10 ms on the others: the step's median is 10 ms, so a sample
    late after ``heavy_tail`` has work left worth moving (the hand-off rule)."""
    time.sleep(0.15 if int(x[0]) % 8 == 0 else 0.01)
    return x


def _session(loader: hr.DataLoader) -> Any:
    assert loader.remote is not None
    return loader.remote


def pipeline(n: int, work_ms: float, kb: int = 4) -> hr.Pipeline:
    return hr.Pipeline(SimSource(n, work_ms, kb), [hr.step(augment, name="augment", random=True)])


def consume(loader: Any, model_s: float, epochs: int = 1,
            on_batch: Any = None) -> tuple[float, int]:
    """Iterate ``epochs``, simulating ``model_s`` of accelerator time per batch: (wall, samples)."""
    pause = threading.Event()
    t0, n = time.perf_counter(), 0
    for _ in range(epochs):
        for b in loader:
            pause.wait(model_s)
            n += len(b)
            if on_batch is not None:
                on_batch()
    return time.perf_counter() - t0, n


def scaling(args: argparse.Namespace, cluster: BenchCluster,
            on_row: Any = None) -> list[dict[str, Any]]:
    """One warm-up epoch (untimed: worker and actor start-up; remote workers are waited for),
    then one timed epoch per row; workers persist between the two. A row that fails is
    recorded with its error (and a broken cluster replaced) and the next row runs.
    ``on_row(rows)``: called after every row (the harness writes what it has)."""
    n, bs, model_s = args.samples, args.batch_size, args.model_ms / 1000.0
    bound = bs / model_s if model_s > 0 else float("inf")

    def timed(label: str, loader: Any, remote: int) -> dict[str, Any]:
        consume(loader, model_s)
        if remote and not _session(loader).wait_ready(remote):
            raise RuntimeError(f"{label}: the remote workers were not placed within 120 s")
        r0 = _session(loader).remote_samples if remote else 0
        wall, got = consume(loader, model_s)
        row = {"loader": label, "remote": remote, "samples_per_s": got / wall,
               "accelerator_bound": bound}
        if remote:
            row["remote_samples"] = _session(loader).remote_samples - r0
        return row

    def torch_row() -> dict[str, Any]:
        tl = torch.utils.data.DataLoader(TorchSim(SimSource(n, args.work_ms)), batch_size=bs,
                                         num_workers=1, persistent_workers=True)
        return timed("torch DataLoader, 1 worker", tl, 0)

    def headrace_row(k: int) -> dict[str, Any]:
        opts = hr.Options(cache=None, remote=hr.Remote(max_workers=k, workers=k,
                                                       **cluster.remote_kw())) \
            if k else hr.Options(cache=None)
        label = f"headrace, 1 local + {k} remote" if k else "headrace, 1 local worker"
        loader: hr.DataLoader[Any] = hr.DataLoader(pipeline(n, args.work_ms), batch_size=bs,
                                                   num_workers=1, persistent_workers=True,
                                                   options=opts)
        try:
            return timed(label, loader, k)
        finally:
            loader.close()

    rows: list[dict[str, Any]] = []
    plan: list[tuple[str, Any]] = [("torch DataLoader, 1 worker", torch_row),
                                   ("headrace, 1 local worker", lambda: headrace_row(0))]
    plan += [(f"headrace, 1 local + {k} remote", lambda k=k: headrace_row(k))
             for k in args.remote_workers]
    for label, run in plan:
        rows.append(guarded(label, run, cluster, {"loader": label}))
        if on_row is not None:
            on_row(rows)
    return rows


def guarded(label: str, run: Any, cluster: BenchCluster, failed: dict[str, Any]) -> Any:
    """``run()``, or, when it raises, ``failed`` with the error (and a fresh cluster when
    Ray lost a node: the next row or section starts whole)."""
    try:
        cluster.ensure()
        return run()
    except Exception as e:  # noqa: BLE001 - one row's failure must not lose the others
        log.exception("bench remote: %s failed", label)
        restarted = cluster.ensure()
        return {**failed, "error": f"{type(e).__name__}: {e}"[:500],
                "cluster_restarted": restarted}


def slow_lane(args: argparse.Namespace, cluster: BenchCluster) -> list[dict[str, Any]]:
    """Does finishing slow-lane samples remotely pay? A heavy-tailed pipeline (one sample in 8
    spends 2 x 150 ms in two steps, handed off between them; the others 10 ms in the second),
    half the samples of the other sections (it is the slowest per sample), 1 local + 2 remote
    workers, ``Remote(slow_lane=False)`` vs ``True``; warm-up epoch, then a timed one."""
    model_s = args.model_ms / 1000.0

    def row(flag: bool) -> dict[str, Any]:
        pipe = hr.Pipeline(SimSource(max(96, args.samples // 2), args.work_ms / 4), [
            hr.step(heavy_tail, name="heavy1"), hr.step(augment, name="augment", random=True),
            hr.step(heavy_tail_then_light, name="heavy2")])
        opts = hr.Options(cache=None, remote=hr.Remote(
            max_workers=2, workers=2, slow_lane=flag, **cluster.remote_kw()))
        loader: hr.DataLoader[Any] = hr.DataLoader(pipe, batch_size=args.batch_size,
                                                   num_workers=1, persistent_workers=True,
                                                   options=opts)
        try:
            consume(loader, model_s)
            if not _session(loader).wait_ready(2):
                raise RuntimeError("slow lane rows: the remote workers were not placed "
                                   "within 120 s")
            r0 = _session(loader).resumed_remote
            wall, got = consume(loader, model_s)
            last = loader.stats().last
            return {"slow_lane_to_remote": flag, "samples_per_s": got / wall,
                    "slow_samples": last.slow_samples if last else None,
                    "resumed_remotely": _session(loader).resumed_remote - r0}
        finally:
            loader.close()

    return [guarded(f"slow lane {flag}", lambda f=flag: row(f), cluster,
                    {"slow_lane_to_remote": flag}) for flag in (False, True)]


LOCAL_COST_PER_HOUR = 12.0
"""The training host's price against 1 per remote worker: about an accelerator VM's against a
CPU VM's (Pecan's TPU hosts and remote workers). At 4 the cheapest configuration by batch cost
and the one a worker short of it (stalling 10%) were within 1% of each other, and window noise
decided between them from run to run."""


def autoplace(args: argparse.Namespace, cluster: BenchCluster, out: Path) -> dict[str, Any]:
    opts = hr.Options(cache=None, remote=hr.Remote(
        max_workers=max(args.remote_workers), autoplace=True, window=args.window,
        cost_per_worker_hour=1.0, local_cost_per_hour=LOCAL_COST_PER_HOUR,
        **cluster.remote_kw()))
    loader: hr.DataLoader[Any] = hr.DataLoader(pipeline(args.samples, args.work_ms),
                                               batch_size=args.batch_size, num_workers=1,
                                               persistent_workers=True, options=opts)
    wall, got, epochs = 0.0, 0, 0
    try:
        # all --epochs epochs: after converging the policy keeps trying one remote worker
        # fewer now and then (planner/placement.py, step 5), and those tries are part of
        # what it costs
        while epochs < args.epochs:
            w, n = consume(loader, args.model_ms / 1000.0)
            wall, got, epochs = wall + w, got + n, epochs + 1
        ctl = _session(loader).placement
        explain = loader.explain()
    finally:
        loader.close()
    timeline = [vars(p) for p in ctl.timeline] if ctl is not None else []
    moves = [(t, m.local, m.remote, m.bpt, m.reason) for t, m in (ctl.moves if ctl else [])]
    final = None
    if ctl is not None:
        st = ctl.state
        final = {"local": st.local, "remote": st.remote, "phase": st.phase, "bpt": st.last_bpt,
                 "converged": ctl.converged}
    if timeline:
        _plot_timeline(timeline, args.model_ms / 1000.0, out / "autoplace-timeline.png")
    return {"samples_per_s": got / wall, "epochs": epochs, "timeline": timeline, "moves": moves,
            "final": final, "explain": explain}


def _plot_timeline(points: list[dict[str, Any]], model_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [p["t"] for p in points]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    ax1.step(t, [p["remote"] for p in points], where="post", label="remote workers")
    ax1.step(t, [p["local"] for p in points], where="post", label="local workers")
    ax1.set_ylabel("workers")
    ax1.legend()
    ax1.set_title("AutoPlacement (Pecan): worker counts and batch time")
    ax2.plot(t, [1000 * p["bpt"] for p in points], marker=".", label="batch time (window mean)")
    ax2.axhline(1000 * model_s, ls="--", color="gray", label="accelerator step")
    ax2.set_ylabel("ms per batch")
    ax2.set_xlabel("seconds")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def decisions(args: argparse.Namespace, cluster: BenchCluster) -> list[dict[str, Any]]:
    """FastFlow's decision for CPU-, I/O- and GPU-bound variants of the workload."""
    from headrace.remote import plan_offload

    variants = [  # (name, work ms, sample KiB, model ms per batch, link bytes/s)
        ("CPU-bound", args.work_ms, 4, 1.0, float("inf")),
        ("I/O-bound", args.work_ms, 1024, 1.0, args.bandwidth),
        ("GPU-bound", args.work_ms, 4, 1.5 * args.work_ms * args.batch_size, float("inf")),
    ]

    def row(name: str, work_ms: float, kb: int, model_ms: float, bw: float) -> dict[str, Any]:
        opts = hr.Options(cache=None, remote=hr.Remote(max_workers=max(args.remote_workers),
                                                       **cluster.remote_kw()))
        loader: hr.DataLoader[Any] = hr.DataLoader(pipeline(args.samples, work_ms, kb),
                                                   batch_size=args.batch_size, num_workers=1,
                                                   options=opts)
        try:
            pause = threading.Event()
            d, local = plan_offload(loader, lambda _b, s=model_ms / 1000.0, e=pause: e.wait(s),
                                    batches=args.probe_batches, warmup=2, bandwidth=bw)
            return {"variant": name, "offload": d.offload, "reason": d.reason,
                    "split": [d.best.start, d.best.stop] if d.best else None,
                    "ratio": d.ratio, "gthp": d.gthp, "lthp": d.lthp, "lower": d.lower,
                    "upper": d.upper, "predicted": d.predicted,
                    "remote_workers": _session(loader).target, "describe": d.describe()}
        finally:
            loader.close()

    return [guarded(f"decision {v[0]}", lambda v=v: row(*v), cluster, {"variant": v[0]})
            for v in variants]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench-remote")
    p.add_argument("--address", default=None, help="a running cluster (default: start one)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--node-cpus", type=int, default=6,
                   help="slots per Ray CPU node (2 x 6: room for the stall-free point, 8)")
    p.add_argument("--samples", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--work-ms", type=float, default=20.0)
    p.add_argument("--model-ms", type=float, default=40.0)
    p.add_argument("--remote-workers", type=int, nargs="+", default=[1, 2, 4, 8, 12])
    p.add_argument("--epochs", type=int, default=20,
                   help="AutoPlacement: epochs to run")
    p.add_argument("--window", type=int, default=20,
                   help="AutoPlacement: batches per window (at 10 the window noise at the "
                        "stall edge decided between 7, 8 and 9 remote workers)")
    p.add_argument("--probe-batches", type=int, default=20)
    p.add_argument("--bandwidth", type=float, default=20e6, help="I/O-bound link, bytes/s")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS),
                   help="sections to run (default: all)")
    p.add_argument("--tiny", action="store_true", help="prove the harness runs (no timings)")
    args = p.parse_args(argv)
    if args.tiny:
        args.samples, args.remote_workers, args.epochs, args.nodes = 96, [1, 2], 1, 2
        args.node_cpus, args.probe_batches, args.window = 2, 3, 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cluster = BenchCluster(args.nodes, args.node_cpus, args.address)
    setup = (f"{args.samples} samples of {args.work_ms:g} ms simulated work, batch "
             f"{args.batch_size}, accelerator {args.model_ms:g} ms/batch, 1 local worker; "
             f"{args.nodes} Ray CPU nodes x {args.node_cpus} slots")
    res: dict[str, Any] = {"setup": setup, "args": vars(args), "unfinished": list(args.sections)}
    failed = 0
    cluster.start()
    try:
        for name in args.sections:
            def save(part: Any, name: str = name) -> None:
                res[name] = part
                res["cluster_restarts"] = cluster.restarts
                write(out, res)

            if name == "scaling":
                part: Any = scaling(args, cluster, on_row=save)
            elif name == "autoplace":
                part = guarded("autoplace", lambda: autoplace(args, cluster, out), cluster, {})
            else:
                part = SECTIONS[name](args, cluster)
            res["unfinished"].remove(name)
            save(part)
            failed += sum("error" in r for r in (part if isinstance(part, list) else [part]))
    finally:
        cluster.stop()
        write(out, res)
    print(markdown(res))
    if failed:
        print(f"{failed} row(s) failed: see their errors above and in {out / 'results.json'}")
    return 1 if failed else 0


SECTIONS: dict[str, Any] = {"scaling": scaling, "autoplace": autoplace, "decisions": decisions,
                            "slow_lane": slow_lane}
"""The harness's sections, in the order they run."""


if __name__ == "__main__":
    raise SystemExit(main())
