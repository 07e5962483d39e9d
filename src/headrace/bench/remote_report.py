"""The remote benchmark's report: ``results.json`` and ``results.md`` from its results.

Written after every row (``bench/remote.py``), so a run that stops keeps what it measured; a
row or section that failed shows as ``**failed**`` with its error, sections not reached are
named.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _failed(r: dict[str, Any], cols: int) -> str | None:
    """The table cells of a row that failed (None: it did not)."""
    if "error" not in r:
        return None
    return " | ".join(["**failed**: " + r["error"].replace("|", "/")] + [""] * (cols - 1))


def markdown(res: dict[str, Any]) -> str:
    out = ["## Remote workers (Ray)", "", res["setup"], ""]
    if res.get("cluster_restarts"):
        out += [f"The Ray cluster was replaced {res['cluster_restarts']} time(s) after a "
                "failure (see the failed rows).", ""]
    out += ["| loader | remote workers | samples/s | accelerator bound |", "|---|---|---|---|"]
    for r in res.get("scaling", []):
        bad = _failed(r, 3)
        out.append(f"| {r['loader']} | {bad} |" if bad else
                   f"| {r['loader']} | {r['remote']} | {r['samples_per_s']:.1f} | "
                   f"{r['accelerator_bound']:.1f} |")
    a = res.get("autoplace")
    if a is not None and "error" in a:
        out += ["", f"AutoPlacement: **failed**: {a['error']}"]
    elif a is not None:
        out += ["", f"AutoPlacement: {a['samples_per_s']:.1f} samples/s over "
                f"{a.get('epochs', '?')} epochs, {len(a['moves'])} moves; timeline in "
                "`autoplace-timeline.png`."]
        if a.get("final") is not None:
            f = a["final"]
            conv = f.get("converged")
            out.append(f"Last converged to {conv[0]} local + {conv[1]} remote worker(s)."
                       if conv is not None else "Never converged.")
            where = "In its watch phase" if f["phase"] == "watch" else \
                f"In phase {f['phase']}"
            out.append(f"{where} at the end, at {f['local']} local + {f['remote']} remote "
                       f"worker(s), window batch time {1e3 * f['bpt']:.1f} ms.")
    out += ["", "| variant | offload | split [a, b) | ratio | Gthp | Lthp | remote workers |",
            "|---|---|---|---|---|---|---|"]
    for d in res.get("decisions", []):
        bad = _failed(d, 6)
        out.append(f"| {d['variant']} | {bad} |" if bad else
                   f"| {d['variant']} | {'yes' if d['offload'] else 'no'} | {d['split']} | "
                   f"{d['ratio']:.2f} | {d['gthp']:.1f} | {d['lthp']:.1f} | "
                   f"{d['remote_workers']} |")
    out += ["", "| slow lane to remote | samples/s | slow samples | resumed remotely |",
            "|---|---|---|---|"]
    for r in res.get("slow_lane", []):
        flag = "yes" if r["slow_lane_to_remote"] else "no"
        bad = _failed(r, 3)
        out.append(f"| {flag} | {bad} |" if bad else
                   f"| {flag} | {r['samples_per_s']:.1f} | {r['slow_samples']} | "
                   f"{r['resumed_remotely']} |")
    if res.get("unfinished"):
        out += ["", f"Not run (the harness stopped before them): {', '.join(res['unfinished'])}."]
    return "\n".join(out) + "\n"


def write(out: Path, res: dict[str, Any]) -> None:
    """``results.json`` and ``results.md`` as they stand (after every row and section)."""
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(res, indent=1, default=str))
    os.replace(tmp, out / "results.json")
    (out / "results.md").write_text(markdown(res))
