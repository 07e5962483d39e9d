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

Writes ``results.json``, ``results.md`` and ``autoplace-timeline.png`` to ``--out``. Timings
must come from a quiet machine; ``--tiny`` only proves that the harness runs.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import headrace as hr


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


def scaling(args: argparse.Namespace, remote_kw: dict[str, Any]) -> list[dict[str, Any]]:
    """One warm-up epoch (untimed: worker and actor start-up; remote workers are waited for),
    then one timed epoch per row; workers persist between the two."""
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

    tl = torch.utils.data.DataLoader(TorchSim(SimSource(n, args.work_ms)), batch_size=bs,
                                     num_workers=1, persistent_workers=True)
    rows = [timed("torch DataLoader, 1 worker", tl, 0)]
    del tl
    local: hr.DataLoader[Any] = hr.DataLoader(pipeline(n, args.work_ms), batch_size=bs, num_workers=1,
                          persistent_workers=True)
    rows.append(timed("headrace, 1 local worker", local, 0))
    local.close()
    for k in args.remote_workers:
        opts = hr.Options(remote=hr.Remote(max_workers=k, workers=k, **remote_kw))
        loader: hr.DataLoader[Any] = hr.DataLoader(pipeline(n, args.work_ms), batch_size=bs, num_workers=1,
                               persistent_workers=True, options=opts)
        rows.append(timed(f"headrace, 1 local + {k} remote", loader, k))
        loader.close()
    return rows


def slow_lane(args: argparse.Namespace, remote_kw: dict[str, Any]) -> list[dict[str, Any]]:
    """Does finishing slow-lane samples remotely pay? A heavy-tailed pipeline (one sample in 8
    spends 2 x 150 ms in two steps, handed off between them; the others 10 ms in the second),
    1 local + 2 remote workers,
    ``Remote(slow_lane=False)`` vs ``True``; warm-up epoch, then a timed one."""
    rows = []
    model_s = args.model_ms / 1000.0
    for flag in (False, True):
        pipe = hr.Pipeline(SimSource(args.samples, args.work_ms / 4), [
            hr.step(heavy_tail, name="heavy1"), hr.step(augment, name="augment", random=True),
            hr.step(heavy_tail_then_light, name="heavy2")])
        opts = hr.Options(remote=hr.Remote(max_workers=2, workers=2, slow_lane=flag, **remote_kw))
        loader: hr.DataLoader[Any] = hr.DataLoader(pipe, batch_size=args.batch_size, num_workers=1,
                               persistent_workers=True, options=opts)
        consume(loader, model_s)
        if not _session(loader).wait_ready(2):
            raise RuntimeError("slow lane rows: the remote workers were not placed within 120 s")
        r0 = _session(loader).resumed_remote
        wall, got = consume(loader, model_s)
        last = loader.stats().last
        rows.append({"slow_lane_to_remote": flag, "samples_per_s": got / wall,
                     "slow_samples": last.slow_samples if last else None,
                     "resumed_remotely": _session(loader).resumed_remote - r0})
        loader.close()
    return rows


def autoplace(args: argparse.Namespace, remote_kw: dict[str, Any], out: Path) -> dict[str, Any]:
    opts = hr.Options(remote=hr.Remote(max_workers=max(args.remote_workers), autoplace=True,
                                       window=args.window, cost_per_worker_hour=1.0,
                                       local_cost_per_hour=4.0, **remote_kw))
    loader: hr.DataLoader[Any] = hr.DataLoader(pipeline(args.samples, args.work_ms), batch_size=args.batch_size,
                           num_workers=1, persistent_workers=True, options=opts)
    wall, got = consume(loader, args.model_ms / 1000.0, epochs=args.epochs)
    ctl = _session(loader).placement
    timeline = [vars(p) for p in ctl.timeline] if ctl is not None else []
    moves = [(t, m.local, m.remote, m.bpt, m.reason) for t, m in (ctl.moves if ctl else [])]
    explain = loader.explain()
    loader.close()
    if timeline:
        _plot_timeline(timeline, args.model_ms / 1000.0, out / "autoplace-timeline.png")
    return {"samples_per_s": got / wall, "timeline": timeline, "moves": moves,
            "explain": explain}


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


def decisions(args: argparse.Namespace, remote_kw: dict[str, Any]) -> list[dict[str, Any]]:
    """FastFlow's decision for CPU-, I/O- and GPU-bound variants of the workload."""
    from headrace.remote import plan_offload

    variants = [  # (name, work ms, sample KiB, model ms per batch, link bytes/s)
        ("CPU-bound", args.work_ms, 4, 1.0, float("inf")),
        ("I/O-bound", args.work_ms, 1024, 1.0, args.bandwidth),
        ("GPU-bound", args.work_ms, 4, 1.5 * args.work_ms * args.batch_size, float("inf")),
    ]
    rows = []
    for name, work_ms, kb, model_ms, bw in variants:
        opts = hr.Options(remote=hr.Remote(max_workers=max(args.remote_workers), **remote_kw))
        loader: hr.DataLoader[Any] = hr.DataLoader(pipeline(args.samples, work_ms, kb), batch_size=args.batch_size,
                               num_workers=1, options=opts)
        pause = threading.Event()
        d, local = plan_offload(loader, lambda _b, s=model_ms / 1000.0, e=pause: e.wait(s),
                                batches=args.probe_batches, warmup=2, bandwidth=bw)
        rows.append({"variant": name, "offload": d.offload, "reason": d.reason,
                     "split": [d.best.start, d.best.stop] if d.best else None,
                     "ratio": d.ratio, "gthp": d.gthp, "lthp": d.lthp, "lower": d.lower,
                     "upper": d.upper, "predicted": d.predicted,
                     "remote_workers": _session(loader).target, "describe": d.describe()})
        loader.close()
    return rows


def markdown(res: dict[str, Any]) -> str:
    out = ["## Remote workers (Ray)", "", res["setup"], "",
           "| loader | remote workers | samples/s | accelerator bound |", "|---|---|---|---|"]
    for r in res["scaling"]:
        out.append(f"| {r['loader']} | {r['remote']} | {r['samples_per_s']:.1f} | "
                   f"{r['accelerator_bound']:.1f} |")
    a = res["autoplace"]
    out += ["", f"AutoPlacement: {a['samples_per_s']:.1f} samples/s over the run, "
            f"{len(a['moves'])} moves; timeline in `autoplace-timeline.png`.", "",
            "| variant | offload | split [a, b) | ratio | Gthp | Lthp | remote workers |",
            "|---|---|---|---|---|---|---|"]
    for d in res["decisions"]:
        out.append(f"| {d['variant']} | {'yes' if d['offload'] else 'no'} | {d['split']} | "
                   f"{d['ratio']:.2f} | {d['gthp']:.1f} | {d['lthp']:.1f} | "
                   f"{d['remote_workers']} |")
    out += ["", "| slow lane to remote | samples/s | slow samples | resumed remotely |",
            "|---|---|---|---|"]
    for r in res["slow_lane"]:
        out.append(f"| {'yes' if r['slow_lane_to_remote'] else 'no'} | "
                   f"{r['samples_per_s']:.1f} | {r['slow_samples']} | {r['resumed_remotely']} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench-remote")
    p.add_argument("--address", default=None, help="a running cluster (default: start one)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--node-cpus", type=int, default=4)
    p.add_argument("--samples", type=int, default=1200)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--work-ms", type=float, default=20.0)
    p.add_argument("--model-ms", type=float, default=40.0)
    p.add_argument("--remote-workers", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--probe-batches", type=int, default=20)
    p.add_argument("--bandwidth", type=float, default=20e6, help="I/O-bound link, bytes/s")
    p.add_argument("--tiny", action="store_true", help="prove the harness runs (no timings)")
    args = p.parse_args(argv)
    if args.tiny:
        args.samples, args.remote_workers, args.epochs, args.nodes = 96, [1, 2], 1, 2
        args.node_cpus, args.probe_batches, args.window = 2, 3, 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import ray

    cluster = None
    if args.address is None:
        from ray.cluster_utils import Cluster

        src = str(Path(hr.__file__).resolve().parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join(
            x for x in (src, os.environ.get("PYTHONPATH", "")) if x)
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "object_store_memory": 200 << 20})
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.node_cpus, resources={"cpu_node": 1000},
                             object_store_memory=200 << 20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
    remote_kw: dict[str, Any] = {"address": args.address or "auto"}
    if cluster is not None:
        remote_kw["resources"] = {"cpu_node": 1}
    try:
        setup = (f"{args.samples} samples of {args.work_ms:g} ms simulated work, batch "
                 f"{args.batch_size}, accelerator {args.model_ms:g} ms/batch, 1 local worker; "
                 f"{args.nodes} Ray CPU nodes x {args.node_cpus} slots")
        res = {"setup": setup, "args": vars(args), "scaling": scaling(args, remote_kw),
               "autoplace": autoplace(args, remote_kw, out),
               "decisions": decisions(args, remote_kw),
               "slow_lane": slow_lane(args, remote_kw)}
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "results.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
