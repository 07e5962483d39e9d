"""Small samples: headrace vs torch's DataLoader when a sample's steps take microseconds.

    python -m headrace.bench.small_samples [--rounds 3] [--samples 20000] [--workers 2]
    python -m headrace.bench.small_samples --runner [--samples 5000]
    python -m headrace.bench.small_samples --executors [--samples 20000]

Three workloads, no simulated accelerator (the training loop only takes batches, so the
loader's own throughput is measured): ``cifar`` (CIFAR-10-sized 32x32x3 images: reflect-pad-and-crop,
flip, normalize, as a CIFAR training script does; about 40-70 µs of NumPy per sample, written as
a headrace ``Pipeline`` of steps), ``cifar-dataset`` (the same work as a user writes it for
torch: a map-style dataset with a Compose in ``__getitem__`` drawing from torch's global
generator, returning ``(image, label)``) and ``tiny`` (a 16 KB array and one addition: the
per-sample price of the loader alone). Rows, each
a fresh loader's first epoch, interleaved round-robin over the rounds: ``headrace`` (defaults,
out of order: the default cache included, which a ``Pipeline`` has and a dataset does not; no
profile store, so that no row starts from what an earlier one measured), ``headrace, no
cache`` (``cache=None``: what the rows were run with before the cache's per-sample price was
measured), ``headrace, Python seeded every step`` (Python's global generator seeded before
every step, not only before those that draw from it: ``runner.PYTHON_MARKS`` off, as before
the marks), ``headrace, short moves`` (a late sample moves to the slow lane however
little of its steps is left: ``planner.timeout.HANDOFF_MIN_S`` set to 0, as before that floor),
``headrace, 1 ms messages`` (cheap samples queued and sent as samples of
1-2 ms are: ``queueing.CHEAP_QUEUE_S`` and ``CHEAP_HOLD_S`` set to ``QUEUE_S`` and ``HOLD_S``,
as before the cheap tier), ``headrace, a message per sample`` (worker processes given one
sample at a time: ``planner.queueing.MAX_DEPTH`` set to its minimum for that row, as before
queueing was adaptive) and torch's DataLoader (out of order) at half, equal and twice the
worker count. torch's dataset runs the same steps, each sample drawing from its own
``default_rng(index)`` (so both loaders pay for a generator per sample). Prints a Markdown
table: samples/s, the training process's CPU per sample, the workers' CPU per sample (what the
processes reaped during the epoch used) and headrace's samples moved to the slow lane per
epoch, median (min-max) over the rounds.

``--executors`` runs the ``cifar`` pipeline over three epochs with one loader per executor
(processes, ``"auto"``, threads) and prints each epoch's samples/s and auto's decision.

``--runner`` prices, in this process and without workers, what running one sample's steps
costs beyond the steps themselves (``pipeline/runner.py``'s ``SampleRunner``): the per-step
re-seeding of the global generators, a generator per random step and the sample's root seed,
each left out in turn (a diagnostic: the rows without them do not give headrace's samples).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from headrace.bench.summary import Spread
from headrace.pipeline import Pipeline, runner, step
from headrace.planner import queueing, timeout

_MEAN = np.array([125.3, 123.0, 113.9], np.float32)
_STD = np.array([63.0, 62.1, 66.7], np.float32)


class _Images:
    """``n`` random 32x32x3 uint8 images (a source: ``load(i)``)."""

    def __init__(self, n: int) -> None:
        self.data = np.random.default_rng(0).integers(0, 255, (n, 32, 32, 3), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.data)

    def load(self, i: int) -> np.ndarray:
        return self.data[i]


class _Indices:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> int:
        return i


def pad_crop(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Reflect-pad by 4 and crop 32x32 at a random offset (CIFAR's RandomCrop(32, padding=4))."""
    p = np.pad(x, ((4, 4), (4, 4), (0, 0)), mode="reflect")
    i, j = rng.integers(0, 9, 2)
    return p[i:i + 32, j:j + 32]


def flip(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return x[:, ::-1] if rng.random() < 0.5 else x


def normalize(x: np.ndarray) -> torch.Tensor:
    """To a float CHW tensor, per-channel standardized."""
    return torch.from_numpy(((x.astype(np.float32) - _MEAN) / _STD).transpose(2, 0, 1).copy())


def fill(i: int) -> np.ndarray:
    return np.full((64, 64), i, dtype=np.float32)


def add_one(x: np.ndarray) -> np.ndarray:
    return x + 1


def pipelines(n: int) -> dict[str, Pipeline]:
    return {
        "cifar": Pipeline(_Images(n), [step(pad_crop, random=True), step(flip, random=True),
                                       normalize]),
        "tiny": Pipeline(_Indices(n), [fill, add_one]),
    }


class Compose:
    """torchvision's ``Compose`` (not a dependency): the transforms in turn."""

    def __init__(self, transforms: list[Callable[[Any], Any]]) -> None:
        self.transforms = transforms

    def __call__(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


def torch_pad_crop(x: np.ndarray) -> np.ndarray:
    """``pad_crop`` drawing its offset from torch's global generator, as torchvision's
    ``RandomCrop`` does."""
    p = np.pad(x, ((4, 4), (4, 4), (0, 0)), mode="reflect")
    i, j = torch.randint(0, 9, (2,)).tolist()
    return p[i:i + 32, j:j + 32]


def torch_flip(x: np.ndarray) -> np.ndarray:
    return x[:, ::-1] if torch.rand(()) < 0.5 else x


class CifarDataset(torch.utils.data.Dataset):
    """The ``cifar`` workload as a user writes it for torch's loader: a map-style dataset
    whose ``__getitem__`` applies a Compose of transforms drawing from torch's global
    generator, returning ``(image, label)``; headrace measures the Compose where it stands."""

    def __init__(self, n: int) -> None:
        self.data = _Images(n).data
        self.transform = Compose([torch_pad_crop, torch_flip, normalize])

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.data[i]), i % 10


def workloads(n: int) -> dict[str, tuple[Any, torch.utils.data.Dataset]]:
    """``{name: (what headrace's loader is given, torch's dataset)}``: the two pipelines above
    (torch's dataset runs their steps, :class:`_TorchDataset`) and ``cifar-dataset``, one
    dataset object both loaders are given."""
    out: dict[str, tuple[Any, torch.utils.data.Dataset]] = {
        name: (pipe, _TorchDataset(pipe)) for name, pipe in pipelines(n).items()}
    ds = CifarDataset(n)
    out["cifar-dataset"] = (ds, ds)
    return out


class _TorchDataset(torch.utils.data.Dataset):
    """The same steps for torch's DataLoader, a generator per sample."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe

    def __len__(self) -> int:
        return len(self.pipe)

    def __getitem__(self, i: int) -> Any:
        rng = np.random.default_rng(i)
        x = self.pipe.source.load(i)
        for s in self.pipe.steps:
            x = s(x, rng) if s.random else s(x)
        return x


def _epoch(make: Callable[[], Any], n: int, close: bool) -> tuple[float, float, int | None, float]:
    """(wall seconds, training-process CPU seconds, samples moved to the slow lane: ``None``
    for torch, the workers' CPU seconds) of one epoch of a fresh loader. The workers' CPU is
    what the processes this process reaped during the epoch and its close used (``os.times``:
    both loaders join their workers by then)."""
    k0 = os.times()
    loader = make()
    c0, t0 = time.process_time(), time.perf_counter()
    got = 0
    for b in loader:
        got += len(b[-1]) if isinstance(b, list) else len(b)  # [images, labels] or a tensor
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    moved = loader.stats().last.slow_samples if hasattr(loader, "stats") else None
    if close:
        loader.close()
    del loader
    k1 = os.times()
    if got != n:
        raise RuntimeError(f"{got} samples delivered, expected {n}")
    return wall, cpu, moved, (k1.children_user + k1.children_system
                              - k0.children_user - k0.children_system)


_ONE_MS = {(queueing, "CHEAP_QUEUE_S"): queueing.QUEUE_S,
           (queueing, "CHEAP_HOLD_S"): queueing.HOLD_S}
"""The row ``headrace, 1 ms messages``: samples under ``queueing.CHEAP_S`` queued and held as
samples of 1-2 ms are (what every cheap sample had before the cheap tier)."""
_SEEDED = {(runner, "PYTHON_MARKS"): False}
"""The row ``headrace, Python seeded every step``: Python's global generator seeded before every
step, not only before those that draw from it (``pipeline/runner.py``; what every step had
before)."""
_SHORT_MOVES = {(timeout, "HANDOFF_MIN_S"): 0.0}
"""The row ``headrace, short moves``: a late sample moves whenever its steps left typically take
half the timeout, however short that is (what every late sample had before the 2 ms floor)."""


def run(rounds: int, samples: int, workers: int, batch: int = 128) -> dict[str, dict[str, list]]:
    """``{workload: {row: [(wall s, cpu s, moved), ...]}}``, rows interleaved, one epoch each."""
    from headrace.runtime import DataLoader, Options

    opts = Options(profile_store=False)
    uncached = Options(profile_store=False, cache=None)
    out: dict[str, dict[str, list]] = {}
    for name, (pipe, ds) in workloads(samples).items():

        def headrace_row(policy: dict[tuple[Any, str], Any], pipe: Any = pipe,
                         opts: Options = opts) -> tuple[float, float, int | None, float]:
            saved = {k: getattr(*k) for k in policy}  # (module, name): value
            for (module, name), v in policy.items():
                setattr(module, name, v)
            try:
                return _epoch(lambda: DataLoader(pipe, batch_size=batch, num_workers=workers,
                                                 in_order=False, options=opts), samples, True)
            finally:
                for (module, name), v in saved.items():
                    setattr(module, name, v)

        def torch_row(w: int, ds: Any = ds) -> tuple[float, float, int | None, float]:
            return _epoch(lambda: torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=w,
                                                              in_order=False), samples, False)

        rows: dict[str, Callable[[], tuple[float, float, int | None, float]]] = {
            "headrace": lambda: headrace_row({}),
            "headrace, no cache": lambda: headrace_row({}, opts=uncached),
            "headrace, Python seeded every step": lambda: headrace_row(_SEEDED),
            "headrace, short moves": lambda: headrace_row(_SHORT_MOVES),
            "headrace, 1 ms messages": lambda: headrace_row(_ONE_MS),
            "headrace, a message per sample": lambda: headrace_row(
                {(queueing, "MAX_DEPTH"): queueing.MIN_DEPTH}),
        }
        for w in sorted({max(1, workers // 2), workers, 2 * workers}):
            rows[f"torch, {w} workers"] = functools.partial(torch_row, w)
        res: dict[str, list] = {k: [] for k in rows}
        labels = list(rows)
        for r in range(rounds):
            shift = r % len(labels)
            for label in labels[shift:] + labels[:shift]:
                res[label].append(rows[label]())
        out[name] = res
    return out


def runner_costs(samples: int, repeats: int = 5) -> dict[str, float]:
    """Thread CPU µs per CIFAR-sized sample, the least of ``repeats`` interleaved rounds: the
    steps alone (one ``default_rng`` per sample, as torch's dataset here), ``SampleRunner`` as
    headrace runs it, then without re-seeding the global generators before each step, also
    without a generator per random step (one shared), also without the sample's root seed.
    The runner module's seeding functions are swapped for the last three rows and restored."""
    pipe = pipelines(samples)["cifar"]
    ds = _TorchDataset(pipe)
    shared = np.random.default_rng(0)
    no_globals = {"seed_globals": lambda _s: None, "seed_numpy_torch": lambda _s: None}
    no_rngs = {**no_globals, "step_rng": lambda _s: shared}
    swaps: dict[str, dict[str, Any] | None] = {
        "the steps alone": None,
        "headrace's runner": {},
        "without re-seeding the global generators": no_globals,
        "... and without a generator per random step": no_rngs,
        "... and without the sample's root seed": {**no_rngs, "sample_root": lambda *_a: 1},
    }
    saved = {name: getattr(runner, name)
             for name in ("seed_globals", "seed_numpy_torch", "step_rng", "sample_root")}
    out: dict[str, float] = {}
    try:
        for _ in range(repeats):
            for label, swap in swaps.items():
                for name, fn in {**saved, **(swap or {})}.items():
                    setattr(runner, name, fn)
                one: Callable[[int], Any] = ds.__getitem__
                if swap is not None:
                    one = functools.partial(runner.SampleRunner(pipe).run, start=0, value=None,
                                            base_seed=7, epoch=0)
                c0 = time.thread_time()
                for i in range(samples):
                    one(i)
                us = (time.thread_time() - c0) * 1e6 / samples
                out[label] = min(out.get(label, us), us)
    finally:
        for name, fn in saved.items():
            setattr(runner, name, fn)
    return out


def executors(samples: int, workers: int, epochs: int = 3, batch: int = 128) -> dict[str, Any]:
    """``{executor: (samples/s per epoch, what explain() says of the executor)}`` for one loader
    per executor over ``epochs`` epochs of the ``cifar`` pipeline (``bench/executor_epochs.py``):
    ``executor="auto"`` decides in its first epoch and runs its choice from the next (threads'
    first epoch is a trial)."""
    from headrace.bench import executor_epochs

    pipe = pipelines(samples)["cifar"]
    out: dict[str, Any] = {}
    for executor in ("processes", "auto", "threads"):
        walls, why = executor_epochs.epochs(pipe, executor, workers, epochs, batch)
        out[executor] = ([samples / w for w in walls], why)
    return out


def markdown(results: dict[str, dict[str, list]], samples: int, workers: int) -> str:
    lines = []
    for name, rows in results.items():
        best_torch = max((statistics.median(samples / r[0] for r in v), k)
                         for k, v in rows.items() if k.startswith("torch"))
        lines += [f"**{name}** ({samples} samples, batch 128, headrace {workers} workers)", "",
                  "| loader | samples/s | training-process CPU µs/sample "
                  "| workers' CPU µs/sample | vs torch's best | moved to the slow lane |",
                  "|---|---|---|---|---|---|"]
        for label, runs in rows.items():
            rate = Spread.of([samples / r[0] for r in runs])
            cpu = Spread.of([r[1] * 1e6 / samples for r in runs])
            reaped = Spread.of([r[3] * 1e6 / samples for r in runs])
            moved = [r[2] for r in runs if r[2] is not None]
            lines.append(f"| {label} | {rate.text('.0f')} | {cpu.text('.1f')} | "
                         f"{reaped.text('.1f')} | "
                         f"{rate.median / best_torch[0]:.2f}x | "
                         f"{Spread.of(moved).text('.0f') if moved else '–'} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=None,
                    help="samples per epoch (default 20000; --runner: 5000)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runner", action="store_true",
                    help="price the runner's per-sample seeding instead (no workers)")
    ap.add_argument("--executors", action="store_true",
                    help="cifar over 3 epochs per executor: processes, auto, threads")
    a = ap.parse_args(argv)
    if a.executors:
        n = a.samples or 20000
        print(f"**cifar: samples/s per epoch, one loader per executor** ({n} samples, "
              f"{a.workers} workers)\n\n| executor | epoch 1 | epoch 2 | epoch 3 |\n"
              "|---|---|---|---|")
        notes = []
        for executor, (rates, why) in executors(n, a.workers).items():
            print(f"| {executor} | " + " | ".join(f"{r:.0f}" for r in rates) + " |")
            if why:
                notes.append(f"{executor}: {why}")
        print("\n" + "\n".join(notes))
        return
    if a.runner:
        n = a.samples or 5000
        print(f"**cifar: one sample's run in the runner** ({n} samples, least of 5 interleaved rounds)\n\n"
              "| run | thread CPU µs/sample |\n|---|---|")
        for label, us in runner_costs(n).items():
            print(f"| {label} | {us:.1f} |")
        return
    n = a.samples or 20000
    print(markdown(run(a.rounds, n, a.workers), n, a.workers))


if __name__ == "__main__":
    main()
