"""Resume the way users crash: a training script saves with ``torch.save``, a new process
started with ``spawn`` (where the script is ``__mp_main__``) loads and finishes the epoch.

The script defines its Dataset class, a transform holding an array and a closure in
``__main__``; the resumed process must deliver exactly the samples not yet delivered, with the
same content, at every cut point, with shuffle on and off, and after an AutoOrder reorder.
"""

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent('''
    import json, multiprocessing as mp, sys, warnings
    import numpy as np, torch, torch.utils.data as tud
    import headrace as hr

    MODE, SHUFFLE, WORKERS, OUT = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
    N, BS = 24, 4
    WEIGHTS = np.linspace(1.0, 2.0, 8, dtype=np.float32)  # held by a transform

    def make_offset(k):
        def offset(x):  # a closure
            return x + k  # offset
        return offset

    class Scale:
        def __init__(self, w):
            self.w = w
        def __call__(self, x):
            return x * self.w

    class Compose:
        def __init__(self, ts):
            self.transforms = ts
        def __call__(self, x):
            for t in self.transforms:
                x = t(x)
            return x

    class Script(tud.Dataset):  # defined in the training script: __mp_main__ in the child
        def __init__(self):
            self.transform = Compose([Scale(WEIGHTS), make_offset(3.0)])
        def __len__(self):
            return N
        def __getitem__(self, i):
            x = self.transform(np.full(8, float(i), dtype=np.float32))
            return torch.from_numpy(x) + torch.rand(8), i  # random: content depends on seeds

    class Vec:
        def __len__(self):
            return 64
        def load(self, i):
            return np.full(256, i, dtype=np.float32)

    def noise(x, rng):  # keeps the shape: the crop may move before it
        return x + rng.random(len(x)).astype(x.dtype)

    def crop_quarter(x, rng):
        n = len(x) // 4
        s = int(rng.integers(0, len(x) - n + 1))
        return x[s:s + n].copy()

    def loader():
        opts = hr.Options(seed=5, profile_store=False)
        # workers forked: a closure cannot be pickled to a spawned worker (torch's neither)
        ctx = "fork" if WORKERS else None
        if MODE == "dataset":
            return hr.DataLoader(Script(), batch_size=BS, shuffle=SHUFFLE, num_workers=WORKERS,
                                 options=opts, multiprocessing_context=ctx)
        pipe = hr.Pipeline(Vec(), [hr.step(noise, random=True), hr.step(crop_quarter, random=True)])
        return hr.DataLoader(pipe, batch_size=8, shuffle=SHUFFLE, num_workers=WORKERS,
                             options=opts, collate_fn=list)

    def rows(batch):
        if MODE == "dataset":
            x, idx = batch
            return [[int(i), [round(float(v), 5) for v in r]] for i, r in zip(idx, x)]
        return [[int(a[0]) if len(a) else -1, round(float(a.sum()), 3), len(a)] for a in batch]

    def epoch_of(it, limit=None):
        out = []
        for k, b in enumerate(it):
            out += rows(b)
            if limit is not None and k + 1 == limit:
                break
        return out

    def resume(paths, out):
        got = {}
        for cut, path in paths.items():
            l = loader()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                l.load_state_dict(torch.load(path))
            steps = None
            it = iter(l)
            if l.planning is not None:
                steps = [s.name for s in l.planning.executed.steps]
            got[cut] = {"rest": epoch_of(it), "steps": steps,
                        "warnings": [str(x.message) for x in w if "headrace" in str(x.message)],
                        "module": type(l.dataset).__module__}
        json.dump(got, open(out, "w"))

    if __name__ == "__main__":
        epochs = 2 if MODE == "reorder" else 1
        ref_loader = loader()
        full = [epoch_of(iter(ref_loader)) for _ in range(epochs)]
        saved, before = {}, {}
        cuts = list(range(1, 6))
        for cut in cuts:
            l = loader()
            for _ in range(epochs - 1):
                epoch_of(iter(l))  # the profile is learned; the last epoch runs reordered
            before[cut] = epoch_of(iter(l), limit=cut)
            saved[cut] = f"{OUT}.sd{cut}.pt"
            torch.save(l.state_dict(), saved[cut])
            steps_saved = [s.name for s in l.planning.executed.steps]
        if len(sys.argv) > 5:  # the user edits the script before resuming
            src = open(__file__).read().replace("return x + k  # offset", "return x + k + 1  # offset")
            open(__file__, "w").write(src)
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=resume, args=(saved, OUT + ".child"))
        p.start(); p.join(240)
        child = json.load(open(OUT + ".child"))
        json.dump({"full": full[-1], "before": before, "child": child,
                   "steps_saved": steps_saved}, open(OUT, "w"))
''')


def run(tmp_path, mode, shuffle, workers, edited=False):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "result.json"
    args = [sys.executable, str(script), mode, "1" if shuffle else "0", str(workers), str(out)]
    if edited:
        args.append("edited")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=280, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def check_exact(res):
    full = res["full"]
    for cut, got in res["child"].items():
        before = res["before"][cut]
        rest = got["rest"]
        assert sorted(map(json.dumps, before + rest)) == sorted(map(json.dumps, full)), cut
        assert not {json.dumps(r) for r in before} & {json.dumps(r) for r in rest}, cut


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_in_a_spawned_process_at_every_cut_point(tmp_path, shuffle, no_leaks):
    res = run(tmp_path, "dataset", shuffle, 0)
    check_exact(res)
    for cut, got in res["child"].items():
        assert got["module"] == "__mp_main__", cut  # the class really came from the script
        assert got["warnings"] == [], (cut, got["warnings"])
        if not shuffle:  # torch's order is kept, so the rest follows in order
            assert res["before"][cut] + got["rest"] == res["full"]


def test_resume_in_a_spawned_process_with_workers(tmp_path, no_leaks):
    check_exact(run(tmp_path, "dataset", True, 2))


def test_resume_after_an_autoorder_reorder_runs_the_saved_order(tmp_path, no_leaks):
    res = run(tmp_path, "reorder", True, 0)
    assert res["steps_saved"] == ["crop_quarter", "noise"]  # AutoOrder moved the crop up
    check_exact(res)
    for got in res["child"].values():  # a fresh process with no profile: the saved order
        assert got["steps"] == ["crop_quarter", "noise"]


def test_an_edited_script_warns_what_changed_and_resumes(tmp_path, no_leaks):
    """The resuming process runs an edited closure: a warning names the step, and the
    positions still come exactly once (the content of those samples changed, as edited)."""
    res = run(tmp_path, "dataset", True, 0, edited=True)
    for cut, got in res["child"].items():
        assert any("steps changed: offset" in w for w in got["warnings"]), (cut, got["warnings"])
        before = {r[0] for r in res["before"][cut]}
        rest = [r[0] for r in got["rest"]]
        assert sorted(before | set(rest)) == list(range(24)) and not before & set(rest)
