"""The README's "Use with Lightning / Accelerate / torchrun" snippets, run as written on 2 CPU
processes: each is written to a script after a preamble that defines ``dataset`` and ``model``
(and ``optimizer``), followed by an epilogue that records what the rank got."""

from __future__ import annotations

import re
import sys

import pytest

from tests.frameworks.conftest import ROOT, load_json, run_script

pytestmark = [pytest.mark.frameworks, pytest.mark.integration]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
N = 96

PREAMBLE = f'''
import json, os
import torch

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return {N}
    def __getitem__(self, i):
        return torch.full((4,), float(i))

dataset = Data()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
'''

LIGHTNING_PREAMBLE = PREAMBLE + '''
import lightning as L

class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = {}
    def training_step(self, batch, batch_idx):
        self.seen.setdefault(self.current_epoch, []).extend(batch[:, 0].long().tolist())
        return self.layer(batch).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

model = Module()
'''
"""Lightning is imported only where its snippet needs it: an import of it costs each of the
other snippets' processes seconds."""

EPILOGUE = {
    "lightning": "from headrace.planner.workers import available_cpus, rank_cpus\n"
                 "open(f'out{trainer.global_rank}.json', 'w').write(json.dumps("
                 "{'seen': model.seen, 'type': type(trainer.train_dataloader).__name__, "
                 "'cpus': [rank_cpus(), available_cpus()]}))\n",
    "accelerate": "open(f'out{accelerator.process_index}.json', 'w').write(json.dumps("
                  "{'n': len(loader), 'type': type(loader.base_dataloader).__name__}))\n",
    "torchrun": "open(f'out{sampler.rank}.json', 'w').write(json.dumps("
                "{'n': len(loader), 'type': type(loader).__name__}))\n",
}


def snippet(name: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(rf"<!-- snippet: {name} -->\n```python\n(.*?)```", text, re.S)
    assert m, f"README has no '{name}' snippet"
    return m.group(1)


@pytest.mark.parametrize("name", ["lightning", "accelerate", "torchrun"])
def test_readme_snippet_runs_as_written(tmp_path, name):
    script = tmp_path / f"{name}_snippet.py"
    script.write_text((LIGHTNING_PREAMBLE if name == "lightning" else PREAMBLE)
                      + snippet(name) + EPILOGUE[name])
    launcher = [sys.executable] if name == "lightning" else TORCHRUN
    # ACCELERATE_USE_CPU: what `accelerate launch --cpu` sets (multi-process on CPUs)
    run_script(str(script), launcher=launcher, timeout_s=400, cwd=tmp_path,
               env={"ACCELERATE_USE_CPU": "true"})
    outs = [load_json(tmp_path / f"out{r}.json") for r in (0, 1)]
    assert {o["type"] for o in outs} == {"DataLoader"}  # headrace's, on both ranks
    if name == "lightning":  # DDP on 2 CPU processes (tests/frameworks/test_lightning.py: more)
        shares = []
        for epoch in ("0", "1"):
            ranks = [o["seen"][epoch] for o in outs]
            for seen in ranks:
                assert len(seen) == len(set(seen)) == N // 2  # its share, each sample once
            assert set().union(*ranks) == set(range(N))  # disjoint shares covering the dataset
            shares.append(set(ranks[0]))
        assert shares[0] != shares[1]  # DistributedSampler.set_epoch: a new split each epoch
        # Lightning's launcher sets no LOCAL_WORLD_SIZE: both ranks meet at 127.0.0.1, so
        # num_workers="auto" plans each for half the node's cores, not for all of them
        for o in outs:
            assert o["cpus"][0] == max(1, o["cpus"][1] // 2), o["cpus"]
    else:
        assert [o["n"] for o in outs] == [2, 2]  # 48 samples per rank, batches of 32



LAGGING_GLOO = '''
import atexit, os, subprocess, sys

_lagging = []

@atexit.register  # registered first, so it runs last, right before the interpreter finalizes
def _gloo_catches_up():
    for tid in _lagging:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))

def _lagging_gloo():
    """From here on gloo's worker threads (torch names them pt_gloo_runloop) seldom run, as
    on a loaded machine: the process on one CPU beside a busy process, the workers at the
    lowest priority (SCHED_IDLE); at exit they are let run again."""
    cpu = max(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c",
                             f"import os\\nwhile os.getppid() == {os.getpid()}: pass"])
    os.sched_setaffinity(busy.pid, {cpu})
    for tid in map(int, os.listdir("/proc/self/task")):
        os.sched_setaffinity(tid, {cpu})
        if open(f"/proc/self/task/{tid}/comm").read().strip() == "pt_gloo_runloop":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            _lagging.append(tid)
    assert _lagging, "no gloo worker thread found"

import accelerate

_save_state = accelerate.Accelerator.save_state
def _save_state_lagging(self, *args, **kwargs):
    _lagging_gloo()
    return _save_state(self, *args, **kwargs)
accelerate.Accelerator.save_state = _save_state_lagging
'''


def test_accelerate_snippet_exits_cleanly_while_gloo_workers_lag(tmp_path):
    """The README's Accelerate snippet ends right after ``save_state``, whose last collective
    gathers every rank's loader state. gloo's worker threads, kept from running from there
    until the interpreter's exit, dropped that gather's tensors (which takes the GIL) once it
    had begun finalizing, and the rank aborted at exit ("terminate called without an active
    exception", exit -6): what a loaded machine did in about 2 of 10 full test runs."""
    script = tmp_path / "accelerate_lagging.py"
    script.write_text(LAGGING_GLOO + PREAMBLE + snippet("accelerate") + EPILOGUE["accelerate"])
    run_script(str(script), launcher=TORCHRUN, timeout_s=400, cwd=tmp_path,
               env={"ACCELERATE_USE_CPU": "true"})
    assert [load_json(tmp_path / f"out{r}.json")["n"] for r in (0, 1)] == [2, 2]
