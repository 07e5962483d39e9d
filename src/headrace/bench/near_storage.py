"""Near-storage preprocessing benchmark (SOPHON): ``python -m headrace.bench.near_storage``.

One run, side by side: for each storage node size (``--cores``: 1 to 4 storage cores), each
set (OpenImages-like: variable, often large images; ImageNet-like: smaller ones) and each
policy (No-Off, All-Off, Resize-Off, FastFlow-style all-or-nothing, headrace), the bytes the
link carried per epoch, read from the interface counters of a real shaped link, and the epoch
time. The storage node is a Ray node in its own network namespace behind a veth pair shaped
with ``tc`` to ``--rate-mbit`` (``bench/shaped_link.py``; root only), joined to a local Ray
cluster this benchmark starts (a head with no CPUs; the training host's workers are local
processes).

Per policy: a loader with persistent workers; epoch 0 places the storage workers, runs raw
and profiles every sample (headrace and FastFlow decide from it), the next ``--epochs`` are
measured. Writes ``results.json`` and ``results.md`` to ``--out``. Timings must come from a
quiet machine; ``--tiny`` only proves that the harness runs.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import headrace as hr
from headrace.bench.shaped_link import StorageNode
from headrace.workloads import storage_images as si

POLICIES = ("no-off", "all-off", "resize-off", "fastflow", "headrace")
SETS = {"openimages": si.openimages_like, "imagenet": si.imagenet_like}
GOALS = {"openimages": 2.2, "imagenet": 1.2}
"""SOPHON's traffic reductions against No-Off (§4.1), the issue's goals."""


def _collate(batch: list[Any]) -> int:
    return len(batch)  # the consumer only counts: the link and the preprocessing are measured


def run_policy(node: StorageNode, images: si.StorageImages, policy: str,
               args: argparse.Namespace) -> dict[str, Any]:
    """One policy on one set: per measured epoch, wall seconds and bytes on the wire."""
    cores = node.cpus
    kw: dict[str, Any] = {"resize_step": "crop"} if policy == "resize-off" else {}
    opts = hr.Options(seed=1, cache=None, remote=hr.NearStorage(
        policy=policy, bandwidth=args.rate_mbit * 1e6 / 8, max_workers=cores,
        storage_cores=cores, **kw))
    loader: hr.DataLoader[Any] = hr.DataLoader(
        si.pipeline(images), batch_size=args.batch_size, shuffle=True,
        num_workers=args.local_workers, collate_fn=_collate, persistent_workers=True,
        options=opts)
    session = loader.remote
    assert session is not None
    epochs = []
    try:
        for e in range(1 + args.epochs):
            it = iter(loader)
            if e == 0:
                _wait(lambda: session.ready_workers() >= cores, 180.0)
            rx0, tx0 = node.counters()
            t0 = time.perf_counter()
            n = sum(it)
            wall = time.perf_counter() - t0
            rx1, tx1 = node.counters()
            if e == 0:
                continue  # placing workers and profiling
            side = session.near
            rec = side.epochs[-1]
            pred = rec.plan.predicted if rec.plan is not None else None
            epochs.append({
                "epoch": e, "samples": n, "wall_s": wall, "wire_bytes": rx1 - rx0,
                "wire_bytes_to_storage": tx1 - tx0, "payload_bytes": rec.bytes,
                "handed_back": rec.handed_back,
                "offloaded_share": rec.plan.share if rec.plan is not None else None,
                "predicted_bytes": pred.bytes if pred else None,
                "predicted_epoch_s": pred.epoch_s if pred else None,
            })
        return {"policy": policy, "epochs": epochs,
                "wall_s": min(x["wall_s"] for x in epochs),
                "wire_bytes": sum(x["wire_bytes"] for x in epochs) / len(epochs),
                "explain": loader.explain()}
    finally:
        loader.close()


def _wait(cond: Any, timeout_s: float) -> None:
    tick, deadline = threading.Event(), time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("storage workers were not placed in time")
        tick.wait(0.05)


def markdown(res: dict[str, Any]) -> str:
    a = res["args"]
    out = [f"# Near-storage preprocessing (SOPHON), link {a['rate_mbit']} Mbit/s, "
           f"{a['samples']} samples per set, {a['local_workers']} local workers", ""]
    for name, rows in res["sets"].items():
        out += [f"## {name}-like", "",
                "| storage cores | policy | MB per epoch (wire) | vs No-Off | epoch s | "
                "offloaded | predicted MB / s |", "|---|---|---|---|---|---|---|"]
        for cores, runs in rows.items():
            base = next(r["wire_bytes"] for r in runs if r["policy"] == "no-off")
            best = min(r["wall_s"] for r in runs)
            for r in runs:
                last = r["epochs"][-1]
                share = last["offloaded_share"]
                pred = ("-" if last["predicted_bytes"] is None else
                        f"{last['predicted_bytes'] / 1e6:.1f} / {last['predicted_epoch_s']:.2f}")
                mark = " **" if r["wall_s"] == best else ""
                out.append(
                    f"| {cores} | {r['policy']} | {r['wire_bytes'] / 1e6:.1f} | "
                    f"{base / r['wire_bytes']:.2f}x | {r['wall_s']:.2f}{mark} | "
                    f"{'-' if share is None else f'{100 * share:.0f}%'} | {pred} |")
        out += ["", f"Goal (SOPHON): headrace's traffic reduction >= {GOALS[name]}x, and the "
                "shortest epoch (**) in every row group.", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench-near-storage")
    p.add_argument("--samples", type=int, default=600)
    p.add_argument("--scale", type=float, default=1.0, help="image side scale (1: full size)")
    p.add_argument("--rate-mbit", type=float, default=200.0)
    p.add_argument("--cores", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    p.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    p.add_argument("--local-workers", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2, help="measured epochs per policy")
    p.add_argument("--tiny", action="store_true", help="prove the harness runs (no timings)")
    args = p.parse_args(argv)
    if args.tiny:
        args.samples, args.scale, args.cores, args.epochs = 32, 0.25, [1], 1
        args.sets, args.batch_size, args.local_workers = ["openimages"], 8, 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import ray
    from ray.cluster_utils import Cluster

    root = Path(__file__).resolve().parents[2]  # src/: Ray's workers import headrace
    os.environ["PYTHONPATH"] = os.pathsep.join(
        x for x in (str(root), os.environ.get("PYTHONPATH", "")) if x)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "object_store_memory": 200 * 1024 * 1024})
    ray.init(address=cluster.address, log_to_driver=False)
    res: dict[str, Any] = {"args": vars(args), "sets": {}}
    try:
        for cores in args.cores:
            with StorageNode(cluster.address, cpus=cores, rate_mbit=args.rate_mbit,
                             object_store_bytes=200 * 1024 * 1024) as node:
                for name in args.sets:
                    images = SETS[name](args.samples, scale=args.scale, seed=0)
                    rows = res["sets"].setdefault(name, {}).setdefault(str(cores), [])
                    for policy in args.policies:
                        r = run_policy(node, images, policy, args)
                        rows.append(r)
                        print(f"{name} cores={cores} {policy}: {r['wire_bytes'] / 1e6:.1f} MB, "
                              f"{r['wall_s']:.2f} s", flush=True)
                        (out / "results.json").write_text(json.dumps(res, indent=1))
    finally:
        ray.shutdown()
        cluster.shutdown()
    if "no-off" in args.policies:
        (out / "results.md").write_text(markdown(res))
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
