"""The benchmark harness end to end at a tiny size: correctness of the harness, never speed.

Checks that every loader's row is present, that every run saw each sample exactly once (the
harness checks it and raises otherwise), that the outputs are written, and that the CLI parses.
No assertion depends on wall-clock time.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from headrace.bench import BenchConfig, ExactlyOnceError, LoaderSpec, run_and_write
from headrace.bench.measure import _check_exactly_once, run_once
from headrace.bench.runner import build_workload, sampler_order
from headrace.cli import build_parser

pytestmark = pytest.mark.integration

LABELS = ["headrace", "headrace auto", "headrace in_order", "headrace threads", "torch in_order", "torch out_of_order",
          "minimal (reference)"]


def tiny_config(tmp_path, **kw) -> BenchConfig:
    base = dict(
        workloads=("speech-3s", "imseg"),
        time_scale=0.002,  # sleeps of 1 ms / 6 ms, accelerator step 3 ms
        repeats=1,
        warmup=False,
        sweep=False,
        num_workers=2,
        num_samples=30,  # not a multiple of either batch size: a short last batch
        out_dir=str(tmp_path / "out"),
        resource_interval_s=0.05,
    )
    base.update(kw)
    return BenchConfig(**base)


@pytest.mark.timeout(120)
def test_tiny_bench_writes_every_row_and_output(tmp_path):
    config = tiny_config(tmp_path)
    result, paths = run_and_write(config, command="pytest tiny bench")

    assert [w.workload.name for w in result.workloads] == ["speech-3s", "imseg"]
    for w in result.workloads:
        assert [r.label for r in w.rows] == LABELS
        for row in w.rows:
            (run,) = row.runs
            # the harness raised already if an index was missing or repeated; check the totals
            assert run.samples == 30
            assert sum(n for _, _, n in run.batch_times) == 30
            assert run.batches == -(-30 // w.workload.batch_size)
            assert len(run.costs) == 30 and all(c > 0 for c in run.costs)
            assert run.ideal_s >= run.bound_s > 0
            assert run.resources.peak_rss_bytes > 0
            assert run.resources.cpu_s > 0
            assert row.spec.num_workers == 2
        hr = w.row("headrace").runs[0].headrace
        assert hr is not None and hr.fast_samples + hr.slow_samples == 30
        assert w.row("torch in_order").runs[0].headrace is None

    doc = json.loads(paths["json"].read_text())
    assert doc["schema_version"] == 1
    assert [w["name"] for w in doc["workloads"]] == ["speech-3s", "imseg"]
    for w in doc["workloads"]:
        assert [r["label"] for r in w["rows"]] == LABELS
        for r in w["rows"]:
            assert set(r["metrics"]["vs_ideal"]) == {"median", "lo", "hi"}
            assert len(r["runs"]) == 1
        for name in w["plots"].values():
            png = paths["dir"] / name
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert set(w["plots"]) == {"timeline", "cost CDF", "headrace workers/timeout"}

    md = paths["markdown"].read_text()
    assert "headrace revision:" in md and "Consumer step: nominal" in md
    for label in ("headrace threads", "minimal (reference)"):  # a note per workload
        assert md.count(f"{label}: wall ") == 2
    for label in LABELS:
        assert f"| {label} |" in md
    assert "### speech-3s" in md and "### imseg" in md


@pytest.mark.timeout(60)
def test_sweep_adds_a_torch_best_row(tmp_path):
    config = tiny_config(tmp_path, workloads=("imseg",), sweep=True, num_workers=1, plots=False)
    result, _ = run_and_write(config)
    (w,) = result.workloads
    assert [r.label for r in w.rows] == [*LABELS, "torch best"]
    tried = {(r.spec.num_workers, r.spec.prefetch_factor) for r in w.sweep}
    assert {(1, 2), (2, 2)} <= tried  # half the budget rounds up to 1 worker
    assert w.best is not None and (w.best.num_workers, w.best.prefetch_factor) in tried


def test_exactly_once_check_fails_loudly():
    order = [3, 1, 2, 0]
    _check_exactly_once(Counter(order), order, "x", "w")
    with pytest.raises(ExactlyOnceError, match="1 index.*never delivered.*1 delivered too often"):
        _check_exactly_once(Counter([3, 1, 1, 0]), order, "x", "w")


@pytest.mark.timeout(60)
def test_run_once_in_process_loader_counts_every_sample(tmp_path):
    config = tiny_config(tmp_path, num_samples=7)
    wl = build_workload("imseg", config)
    order = sampler_order(len(wl), 0)
    run = run_once(wl, LoaderSpec("torch w0", "torch", 0), order)
    assert run.samples == 7 and run.batches == 3
    assert sorted(order) == list(range(7))


def test_cli_parser_knows_bench_and_demo():
    parser = build_parser()
    args = parser.parse_args(["bench", "imseg", "speech-3s", "--quick", "--out", "x",
                              "--repeats", "2"])
    assert args.workloads == ["imseg", "speech-3s"] and args.quick and args.repeats == 2
    assert args.out == "x" and callable(args.func)
    demo = parser.parse_args(["demo", "--steps", "5"])
    assert demo.steps == 5 and demo.out == "demo-out" and callable(demo.func)


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["bench", "--help"]])
def test_cli_help_exits_cleanly(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 0
    assert "usage: headrace" in capsys.readouterr().out


def test_cli_rejects_an_unknown_workload(capsys):
    from headrace.cli import main

    assert main(["bench", "no-such-workload", "--quick"]) == 2
    assert "unknown workload" in capsys.readouterr().err


def test_splice_into_doc_replaces_only_the_marked_block(tmp_path):
    from headrace.bench.report import DOC_BEGIN, DOC_END, splice_into_doc

    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    doc.write_text(f"# hand-written\n\n{DOC_BEGIN}\nold table\n{DOC_END}\n\ntail\n")
    out = tmp_path / "bench-out"
    splice_into_doc(doc, "| a |\n\nPlots: [timeline](speech-3s-timeline.png).\n", out)
    text = doc.read_text()
    assert text.startswith("# hand-written") and text.endswith("tail\n")
    assert "old table" not in text
    assert "[timeline](../bench-out/speech-3s-timeline.png)" in text
    other = tmp_path / "docs" / "other.md"
    other.write_text("no markers here\n")
    with pytest.raises(ValueError, match="no .* block"):
        splice_into_doc(other, "y", out)
    assert other.read_text() == "no markers here\n"


@pytest.mark.heavy_imports  # its torch optimizer imports torch._dynamo and sympy
@pytest.mark.timeout(240)
def test_demo_trains_several_epochs_and_says_why(tmp_path):
    """``make demo``'s job at a tiny size: both loaders train every epoch on every sample (the
    harness checks exactly-once per epoch), headrace's later epochs are served from its cache,
    and the output names the totals, the reason and the plot's path."""
    from headrace.bench.demo import DemoConfig, run_demo

    lines: list[str] = []
    result = run_demo(DemoConfig(out_dir=str(tmp_path / "demo"), steps=2, epochs=2,
                                 batch_size=8, workers=2, progress=False,
                                 cache_dir=str(tmp_path / "jpegs")), out=lines.append)
    labels = [row.label for row in result.workloads[0].rows]
    assert labels == ["torch DataLoader, epoch 1", "torch DataLoader, epoch 2",
                      "headrace, epoch 1", "headrace, epoch 2"]
    for row in result.workloads[0].rows:
        assert row.typical.samples == 16 and row.typical.batches == 2
    hr_epoch2 = result.workloads[0].rows[3].typical.headrace
    assert hr_epoch2 is not None and hr_epoch2.cache is not None
    assert hr_epoch2.cache.hits == hr_epoch2.cache.lookups == 16  # every sample from the cache
    text = "\n".join(lines)
    assert "headrace trained 2 epochs in" in text and "Why: epoch 1" in text
    assert "served 100% of samples from its sample cache" in text
    filled = result.workloads[0].rows[2].typical.headrace.cache
    assert filled is not None and filled.inserts == 16  # epoch 1 filled it, and says so
    assert "headrace also stored 16 samples" in text
    plot = tmp_path / "demo" / "demo.png"
    assert plot.stat().st_size > 0 and f"Plot: {plot.resolve()}" in text


@pytest.mark.heavy_imports  # its torch optimizer imports torch._dynamo and sympy
@pytest.mark.timeout(240)
def test_a_one_epoch_demo_says_epoch_and_why(tmp_path):
    from headrace.bench.demo import DemoConfig, run_demo

    lines: list[str] = []
    run_demo(DemoConfig(out_dir=str(tmp_path / "demo"), steps=1, epochs=1, batch_size=4,
                        workers=1, progress=False, cache_dir=str(tmp_path / "jpegs")),
             out=lines.append)
    text = "\n".join(lines)
    assert "JPEGs, 1 epoch of 1 training steps" in text  # it read "1 epochs" twice
    assert "headrace trained 1 epoch in " in text
    assert "only one epoch ran, so headrace never read its cache back" in text
