"""``headrace profile`` / ``headrace plan`` on a tiny workload and on scripts (no timing asserts)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap

import pytest

from headrace.cli.profile import register

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

SCRIPT = textwrap.dedent('''
    """A user's training script: a pipeline declared badly (pad before noise) and a train_step."""
    import numpy as np

    import headrace as hr


    class Vectors:
        def __len__(self):
            return 48

        def load(self, i):
            return np.full(4096, i, dtype=np.float32)


    def pad4(x, rng):
        return np.concatenate([x, rng.random(3 * len(x)).astype(x.dtype)])


    def crop_quarter(x, rng):
        n = len(x) // 4
        start = int(rng.integers(0, len(x) - n + 1))
        return x[start:start + n].copy()


    def noise(x, rng):
        return x + rng.random(len(x)).astype(x.dtype)


    pipeline = hr.Pipeline(Vectors(), [hr.step(pad4, random=True), hr.step(noise, random=True),
                                       hr.step(crop_quarter, random=True)])
    batch_size = 8
    num_workers = 2


    def train_step(batch):
        return float(batch.sum())


    if __name__ == "__main__":
        raise SystemExit("the protocol imports the script; its main block must not run")
''')

DATASET_SCRIPT = textwrap.dedent('''
    import torch

    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return torch.full((4,), float(i * i))

    dataset = Squares()
    batch_size = 4
    num_workers = 0
''')


@pytest.fixture(autouse=True)
def _restore_imports(monkeypatch):
    """Scripts are imported as modules with their directory on sys.path: undo both."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in ("train_vectors", "squares", "empty", "stream", "framed", "broken"):
        sys.modules.pop(name, None)


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="headrace")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


def test_profile_a_workload_prints_the_table_histogram_verdict_and_writes_the_png(
        tmp_path, capsys, no_leaks):
    out = tmp_path / "out"
    assert run(["profile", "imseg", "--samples", "48", "--workers", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for name in ("load", "RandomCrop", "RandomFlip", "RandomBrightness", "GaussianNoise", "Cast"):
        assert f"  {name} " in text, text
    for needle in ("p50", "p90", "bytes in", "bytes out", "inflation", "per-sample time",
                   "slow threshold", "verdict: ", "Lthp", "Gthp", "step order for the next epoch"):
        assert needle in text, text
    assert ("input-bound" in text) or ("accelerator-bound" in text)
    png = out / "profile-imseg.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    doc = json.loads((out / "profile-imseg.json").read_text())
    assert doc["samples"] == 48 and len(doc["sample_times_s"]) == 48
    assert doc["probe"]["verdict"] in ("input-bound", "accelerator-bound")
    assert [s["name"] for s in doc["profile"]["steps"]][:2] == ["load", "RandomCrop"]


def test_profile_and_plan_a_script(tmp_path, capsys, no_leaks):
    script = tmp_path / "train_vectors.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    assert run(["profile", str(script), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "pad4" in text and "crop_quarter" in text and "48 samples" in text
    assert "4.00" in text and "0.25" in text  # the inflation factors
    assert "reordered by AutoOrder" in text  # what the next epoch would run
    assert (out / "profile-train_vectors.png").read_bytes()[:8] == PNG_MAGIC

    assert run(["plan", str(script)]) == 0
    text = capsys.readouterr().out
    assert "reordered by AutoOrder" in text and "moved pad4 after noise" in text
    assert "crop_quarter stays after pad4" in text  # both change the shape
    assert "epoch 0" in text and "epoch 1" in text


def test_a_dataset_script_without_train_step_skips_the_verdict(tmp_path, capsys):
    script = tmp_path / "squares.py"
    script.write_text(DATASET_SCRIPT)
    assert run(["profile", str(script), "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "verdict: skipped" in text and "20 samples" in text
    assert (tmp_path / "profile-squares.png").is_file()


def test_bad_targets_exit_2_and_say_why(tmp_path, capsys):
    assert run(["profile", "no-such-workload"]) == 2
    assert "neither a Python script nor a workload" in capsys.readouterr().err
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert run(["plan", str(empty)]) == 2
    assert "define `pipeline`" in capsys.readouterr().err


def test_a_scripts_own_error_on_import_shows_its_traceback_not_a_usage_line(tmp_path, capsys):
    # the script's ValueError was taken for a protocol message: one line, status 2, no file
    # or line; it must read as `python script.py` shows it, and fail with status 1
    script = tmp_path / "broken.py"
    script.write_text("import numpy as np\n\nweights = np.zeros(10).reshape(3, 4)\n")
    assert run(["profile", str(script), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):\n"), err
    assert f'File "{script}", line 3, in <module>' in err
    assert "ValueError: cannot reshape array of size 10 into shape (3,4)" in err
    assert "importlib" not in err and "headrace/cli" not in err  # only the user's frames
    assert err.rstrip().endswith(f"headrace profile: {script} raised while being imported")
    assert "broken" not in sys.modules


def test_a_script_that_does_not_compile_shows_the_syntax_error_as_python_does(tmp_path, capsys):
    # the error was printed under headrace's and importlib's frames (load_script, exec_module)
    script = tmp_path / "broken.py"
    script.write_text("import torch\nreturn torch\n")
    assert run(["plan", str(script)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f'  File "{script}", line 2\n'), err
    assert "SyntaxError: 'return' outside function" in err
    assert "Traceback" not in err and "importlib" not in err and "headrace/cli" not in err


def test_scripts_the_cli_cannot_run_as_written_say_why(tmp_path, capsys):
    # an IterableDataset went to a sampler of indices (torch's ValueError dumped them all),
    # num_workers = "auto" failed int(), --batch-size 0 was taken for the script's own
    iterable = tmp_path / "stream.py"
    iterable.write_text("import torch\n\nclass S(torch.utils.data.IterableDataset):\n"
                        "    def __iter__(self):\n        return iter(range(8))\n\n"
                        "    def __len__(self):\n        return 8\n\ndataset = S()\n")
    assert run(["plan", str(iterable)]) == 2
    assert "is an IterableDataset" in capsys.readouterr().err
    auto = tmp_path / "squares.py"
    auto.write_text(DATASET_SCRIPT.replace("num_workers = 0", 'num_workers = "auto"'))
    assert run(["plan", str(auto), "--epochs", "1"]) == 0
    assert "workers auto" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run(["plan", str(auto), "--batch-size", "0"])
    assert "must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--samples", "0"], ["--samples", "-3"], ["--workers", "-1"],
                                  ["--warmup", "-1"], ["--time-scale", "-1"]])
def test_counts_out_of_range_are_usage_errors(tmp_path, capsys, argv):
    # --samples 0 and -3 profiled 1 sample with status 0; --workers -1 ended in torch's
    # traceback from inside the DataLoader
    script = tmp_path / "squares.py"
    script.write_text(DATASET_SCRIPT)
    with pytest.raises(SystemExit) as exit_:
        run(["profile", str(script), "--out", str(tmp_path), *argv])
    assert exit_.value.code == 2
    assert f"argument {argv[0]}: must be" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["--samples", "abc"], "argument --samples: 'abc' is not an integer"),
    (["--workers", "1.5"], "argument --workers: '1.5' is not an integer"),
    (["--batch-size", ""], "argument --batch-size: '' is not an integer"),
    (["--time-scale", "abc"], "argument --time-scale: 'abc' is not a number"),
])
def test_values_that_are_not_numbers_are_usage_errors_that_say_so(tmp_path, capsys, argv, says):
    # argparse named the type function that raised: "invalid _positive value: 'abc'"
    script = tmp_path / "squares.py"
    script.write_text(DATASET_SCRIPT)
    with pytest.raises(SystemExit) as exit_:
        run(["profile", str(script), "--out", str(tmp_path), *argv])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"headrace profile: error: {says}")


@pytest.mark.parametrize("line, says", [
    ("num_workers = -1", "`num_workers` must be an integer of at least 0 or 'auto', got -1"),
    ("batch_size = 0", "`batch_size` must be an integer of at least 1, got 0"),
    ("batch_size = 'many'", "`batch_size` must be an integer of at least 1, got 'many'"),
])
def test_a_scripts_settings_out_of_range_say_which(tmp_path, capsys, line, says):
    script = tmp_path / "squares.py"
    script.write_text(DATASET_SCRIPT + line + "\n")
    assert run(["plan", str(script), "--epochs", "1"]) == 2
    assert capsys.readouterr().err == f"headrace plan: {script}: {says}\n"


def test_a_failing_sample_says_the_commands_way_to_skip_it(tmp_path, capsys):
    # the error advised options=headrace.Options(on_error='skip'), which no command line could
    # pass: --on-error is that option, and the command says so under the error
    script = tmp_path / "squares.py"
    script.write_text(DATASET_SCRIPT.replace(
        "return torch.full", "if i == 7:\n            raise KeyError(i)\n        return torch.full"))
    for argv in (["profile", str(script), "--out", str(tmp_path)], ["plan", str(script)]):
        assert run(argv) == 1
        err = capsys.readouterr().err
        assert "KeyError: 7" in err and "raise KeyError(i)" in err  # the user's traceback
        assert err.rstrip().endswith(f"headrace {argv[0]}: the command's way to do so is "
                                     "--on-error skip (it reports how many samples it skipped)")
    assert run(["profile", str(script), "--out", str(tmp_path), "--on-error", "skip"]) == 0
    assert "19 samples, batch 4, 0 workers" in capsys.readouterr().out
    assert run(["plan", str(script), "--on-error", "skip", "--epochs", "1"]) == 0
    assert "skipped 1" in capsys.readouterr().out


def test_plan_and_profile_exit_1_when_every_sample_was_skipped(tmp_path, capsys):
    # plan printed "0 samples ... skipped 8" per epoch and exited 0, while profile exited 1
    script = tmp_path / "squares.py"
    script.write_text(DATASET_SCRIPT.replace(
        "return torch.full", "raise KeyError(i)\n        return torch.full"))
    with pytest.warns(UserWarning, match="delivered no batch"):
        assert run(["plan", str(script), "--on-error", "skip", "--epochs", "1"]) == 1
    out, err = capsys.readouterr()
    assert "skipped 20" in out  # explain() is printed, then why the run planned nothing
    assert err.rstrip().endswith("headrace plan: no sample of squares reached the training "
                                 "loop: every sample was skipped (20, --on-error skip)")
    with pytest.warns(UserWarning, match="delivered no batch"):
        assert run(["profile", str(script), "--out", str(tmp_path), "--on-error", "skip"]) == 1
    assert capsys.readouterr().err.rstrip().endswith(
        "headrace profile: no sample of squares was profiled: every sample was skipped "
        "(20, --on-error skip)")


COMPOSE_SCRIPT = textwrap.dedent('''
    import torch

    from tests.helpers import Compose

    def double(x):
        return x * 2

    def grow(x):
        return x.repeat(8)

    class Framed(torch.utils.data.Dataset):
        def __init__(self):
            self.transform = Compose([double, grow])

        def __len__(self):
            return 24

        def __getitem__(self, i):
            return self.transform(torch.full((16,), float(i)))

    dataset = Framed()
    batch_size = 4
    num_workers = 2
''')


def test_profile_says_what_explain_says_of_a_datasets_own_transforms(tmp_path, capsys):
    # profile planned the order as if the transforms were a Pipeline's steps ("no step is
    # random") and spoke of a slow lane explain() says is off
    script = tmp_path / "framed.py"
    script.write_text(COMPOSE_SCRIPT)
    assert run(["profile", str(script), "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "slow lane: off (the steps run inside the dataset's __getitem__" in text
    assert "order: as the dataset calls its transforms" in text


def test_a_fixed_timeout_is_named_fixed_not_a_learned_percentile():
    """stats().timeout_percentile is NaN for TimeoutConfig(fixed_s=...): the profile said
    "the learned hand-off timeout at the end, pnan of per-sample time" (before: a false p75)."""
    import headrace as hr
    from headrace.cli.profile import _threshold
    from tests.helpers import IndexDataset

    loader = hr.DataLoader(IndexDataset(8), batch_size=2,
                           options=hr.Options(timeout=hr.TimeoutConfig(fixed_s=0.005)))
    seconds, what = _threshold(loader, [0.001, 0.002])
    assert seconds == 0.005 and what == "the hand-off timeout fixed by TimeoutConfig(fixed_s=...)"
    loader.close()
