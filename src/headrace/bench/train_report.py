"""``headrace train``'s report: the Markdown table and the plot of its runs
(``bench/train.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headrace.bench.train import TrainRun


def markdown(runs: list[TrainRun], doc: dict[str, Any]) -> str:
    """A table: per workload and loader, epoch times, stall, GPU utilization, final loss."""
    c = doc["config"]
    lines = [f"device: {doc['device']} ({doc['gpu'] or 'no GPU'}), revision "
             f"{doc['machine'].get('headrace_revision')}; {c['epochs']} epochs, workers "
             f"{c['workers'] or 'the workload default'}, width {c['width'] or 'default'}, depth "
             f"{c['depth'] or 'default'}, BLAS threads {c['blas_threads'] or 'unchanged'}", "",
             "| workload | loader | model alone: step ms, GPU util % | epoch s (each) "
             "| stall s (each) | GPU util % (each) | loop / process CPU s (last epoch) "
             "| last-epoch mean loss |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        util = ", ".join("–" if u is None else f"{u:.0f}" for u in r.mean_utilization)
        ceiling = "–" if r.model.utilization is None else f"{r.model.utilization:.0f}"
        last = r.losses[-1]
        lines.append(
            f"| {r.workload} | {r.loader} | {r.model.step_s * 1e3:.1f}, {ceiling} "
            f"| {', '.join(f'{s:.2f}' for s in r.epoch_s)} "
            f"| {', '.join(f'{s:.2f}' for s in r.stall_s)} | {util} "
            f"| {r.loop_cpu_s[-1]:.2f} / {r.process_cpu_s[-1]:.2f} "
            f"| {sum(last) / len(last) if last else float('nan'):.3f} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[TrainRun], path: Path) -> None:
    """GPU utilization over time and the loss per step, a column per workload (nothing
    without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = sorted({r.workload for r in runs})
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 7), squeeze=False)
    for col, name in enumerate(names):
        for r in (r for r in runs if r.workload == name):
            if r.utilization:
                axes[0][col].plot([t for t, _ in r.utilization], [u for _, u in r.utilization],
                                  label=r.loader)
            axes[1][col].plot([v for epoch in r.losses for v in epoch], label=r.loader)
        axes[0][col].set(title=f"{name}: GPU utilization", xlabel="s", ylabel="%")
        axes[1][col].set(title=f"{name}: loss per step", xlabel="step", ylabel="loss")
        for ax in axes[:, col] if hasattr(axes, "shape") else ():
            if ax.has_data():
                ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
