"""The benchmark commands' arguments (``headrace bench | demo | cachebench | train``): a value
they cannot run with is a usage error (exit status 2) naming the flag, before anything runs,
never a library traceback after minutes of work. Parser-level except where a run is needed."""

from __future__ import annotations

import pytest

from headrace.cli import build_parser, main

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("argv", "says"), [
    # cachebench: one epoch only fills the cache (it printed a table of NaN, rc 0); 0 epochs
    # ran the torch rows, then IndexError; --rounds 0: "cannot convert float NaN to integer";
    # --workers 0: torch's prefetch_factor error
    (["cachebench", "--epochs", "1"], "argument --epochs: must be at least 2, got 1 (epoch 1 "
                                      "only fills the cache"),
    (["cachebench", "--epochs", "0"], "argument --epochs: must be at least 2, got 0"),
    (["cachebench", "--rounds", "0", "--jobs-only"], "argument --rounds: must be at least 1"),
    (["cachebench", "--workers", "0"], "argument --workers: must be at least 1, got 0"),
    (["cachebench", "--samples", "-4"], "argument --samples: must be at least 1, got -4"),
    # demo: --steps 0 trained on 0 samples and divided by zero; torch's errors for the others
    (["demo", "--steps", "0"], "argument --steps: must be at least 1, got 0"),
    (["demo", "--threads", "0"], "argument --threads: must be at least 1, got 0"),
    (["demo", "--batch-size", "0"], "argument --batch-size: must be at least 1, got 0"),
    (["demo", "--workers", "-1"], "argument --workers: must be at least 0, got -1"),
    # bench: tracebacks from BenchConfig; --blas-threads -3 was taken silently as 0
    (["bench", "--repeats", "0"], "argument --repeats: must be at least 1, got 0"),
    (["bench", "--workers", "0"], "argument --workers: must be at least 1, got 0"),
    (["bench", "--blas-threads", "-3"], "argument --blas-threads: must be at least 0, got -3"),
    (["bench", "--scale", "0"], "argument --scale: must be above 0, got 0"),
    (["bench", "--time-scale", "nan"], "argument --time-scale: 'nan' is not a finite number"),
    # train: --epochs 0 a traceback, --interval -1 accepted, --scale -1 ignored with --samples
    (["train", "--epochs", "0"], "argument --epochs: must be at least 1, got 0"),
    (["train", "--interval", "-1"], "argument --interval: must be above 0, got -1"),
    (["train", "--samples", "8", "--scale", "-1"], "argument --scale: must be above 0, got -1"),
    (["train", "--blas-threads", "-3"], "argument --blas-threads: must be at least 0, got -3"),
    (["train", "--workers", "-1"], "argument --workers: must be at least 0, got -1"),
    # a non-number names itself, not the type function
    (["cachebench", "--epochs", "abc"], "argument --epochs: 'abc' is not an integer"),
    (["train", "--interval", "x"], "argument --interval: 'x' is not a number"),
])
def test_a_value_the_command_cannot_run_with_is_a_usage_error(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: headrace {argv[0]}"), err
    assert says in err, err


def test_cachebench_help_says_why_two_epochs_and_prints_percent_once(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["cachebench", "--help"])
    out = capsys.readouterr().out
    assert "20% fitting" in out and "%%" not in out  # it showed "20%%"
    assert "at least 2 (epoch 1 only fills the cache" in " ".join(out.split())
    # the types keep the values the commands run with, 0 where it means something
    parse = build_parser().parse_args
    assert parse(["cachebench", "--epochs", "2", "--rounds", "1"]).epochs == 2
    assert parse(["bench", "--blas-threads", "0", "--time-scale", "0"]).blas_threads == 0
    assert parse(["demo", "--workers", "0"]).workers == 0
    assert parse(["train", "--scale", "0.5", "--interval", "0.05"]).scale == 0.5


@pytest.mark.timeout(240)
def test_cachebench_run_refuses_one_epoch_before_any_row(tmp_path):
    from headrace.bench.cache import run

    # it ran every row, then wrote a table of NaN
    with pytest.raises(ValueError, match="epochs must be at least 2, got 1"):
        run(str(tmp_path / "out"), 8, 1, 1, None, False, str(tmp_path / "jpegs"))
    assert not any(tmp_path.iterdir())  # refused before generating or writing anything


def test_train_names_an_unknown_workload_and_loader_without_a_traceback(tmp_path, capsys):
    assert main(["train", "foo", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "no model for workload(s) foo" in capsys.readouterr().err
    assert main(["train", "imseg", "--loaders", "torch,nope", "--out", str(tmp_path)]) == 2
    assert "--loaders: unknown loader(s) nope" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.timeout(240)
def test_bench_update_doc_without_markers_stops_before_the_run(tmp_path, capsys):
    # it found out after the whole run (~17 minutes in full), with a traceback
    doc = tmp_path / "notes.md"
    doc.write_text("# no markers\n")
    out = tmp_path / "out"
    argv = ["bench", "--quick", "imagenet", "--scale", "0.02", "--no-plots", "--no-sweep",
            "--time-scale", "0", "--out", str(out)]
    assert main([*argv, "--update-doc", str(doc)]) == 2
    err = capsys.readouterr().err
    assert f"--update-doc: {doc} has no <!-- headrace-bench:begin -->" in err
    assert not out.exists() and doc.read_text() == "# no markers\n"
    assert main([*argv, "--update-doc", str(tmp_path / "missing.md")]) == 2
    assert "--update-doc: cannot read" in capsys.readouterr().err


def test_demo_config_refuses_zero_steps_before_generating_anything():
    from headrace.bench.demo import DemoConfig

    # run_demo trained both loaders on 0 samples, printed inf, then divided by zero
    with pytest.raises(ValueError, match="steps must be at least 1, got 0"):
        DemoConfig(steps=0)
    with pytest.raises(ValueError, match="workers must be at least 0, got -1"):
        DemoConfig(workers=-1)


@pytest.mark.timeout(240)
def test_bench_no_plots_does_not_say_it_wrote_pngs(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["bench", "--quick", "imagenet", "--scale", "0.02", "--no-plots", "--no-sweep",
                 "--time-scale", "0", "--out", str(out), "--cache-dir",
                 str(tmp_path / "jpegs")]) == 0
    err = capsys.readouterr().err
    assert f"wrote {out / 'results.json'} and {out / 'results.md'}\n" in err
    assert "PNGs" not in err and not list(out.glob("*.png"))
