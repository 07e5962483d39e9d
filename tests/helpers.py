"""Datasets and sources used by tests; importable by worker processes (spawn too)."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections import namedtuple
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

Pair = namedtuple("Pair", ["x", "y"])


class IndexDataset(Dataset):
    """``ds[i] == i`` (as a Python int), optionally sleeping ``cost(i)`` seconds."""

    def __init__(self, n: int, slow_every: int = 0, slow_s: float = 0.0) -> None:
        self.n = n
        self.slow_every = slow_every
        self.slow_s = slow_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self.slow_every and i % self.slow_every == 0:
            time.sleep(self.slow_s)
        return i


class RichDataset(Dataset):
    """Samples of every type default collation handles."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> Any:
        return {
            "tensor": torch.full((2, 3), float(i)),
            "array": np.arange(4, dtype=np.int64) + i,
            "int": i,
            "float": i / 2,
            "str": f"s{i}",
            "tuple": (i, torch.tensor([i])),
            "named": Pair(x=i, y=torch.tensor(float(i))),
            "list": [i, i + 1],
        }


class WorkerInfoDataset(Dataset):
    """Returns (index, worker id, num_workers, pid, value set by worker_init_fn)."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> Any:
        info = torch.utils.data.get_worker_info()
        wid = info.id if info is not None else -1
        nw = info.num_workers if info is not None else 0
        same = info is not None and info.dataset is not None
        return i, wid, nw, os.getpid(), INIT_MARK.get("mark", -1), same


INIT_MARK: dict[str, int] = {}


def init_fn(worker_id: int) -> None:
    INIT_MARK["mark"] = 100 + worker_id


class FailingDataset(Dataset):
    """Raises ValueError on ``bad`` indices."""

    def __init__(self, n: int, bad: set[int]) -> None:
        self.n = n
        self.bad = bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise ValueError(f"corrupt sample {i}")
        return i


class RangeIterable(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


class ArraySource:
    """A source whose raw sample is ``np.array([index], float32)``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> np.ndarray:
        return np.array([i], dtype=np.float32)


class Trace:
    """A step that appends (its name, where it ran) to the sample's trace; optionally slow on
    some. Where: (pid, thread id), so worker processes and worker threads are both told apart."""

    def __init__(self, name: str, slow_every: int = 0, slow_s: float = 0.0) -> None:
        self.name = name
        self.slow_every = slow_every
        self.slow_s = slow_s

    def __call__(self, x: dict) -> dict:
        if self.slow_every and x["index"] % self.slow_every == 0:
            time.sleep(self.slow_s)
        return {"index": x["index"], "trace": [*x["trace"], (self.name, _where())]}


class TraceSource:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> dict:
        return {"index": i, "trace": [("load", _where())]}


def _where() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


def noise(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return x + rng.random(x.shape).astype(np.float32)


def ident_collate(batch: list) -> list:
    return batch


class KillerDataset(Dataset):
    """Kills its own worker process (as the OOM killer would) on ``deadly`` indices."""

    def __init__(self, n: int, deadly: set[int], cost_s: float = 0.0) -> None:
        self.n = n
        self.deadly = deadly
        self.cost_s = cost_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.deadly and torch.utils.data.get_worker_info() is not None:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if self.cost_s:
            time.sleep(self.cost_s)
        return i


class HangingDataset(Dataset):
    """Never returns on ``hung`` indices (a deadlocked decoder)."""

    def __init__(self, n: int, hung: set[int]) -> None:
        self.n = n
        self.hung = hung

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.hung:
            import threading

            threading.Event().wait()  # blocks forever; the loader must replace the worker
        return i


def decode_jpeg(data: bytes) -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


def check_finite(x: np.ndarray) -> np.ndarray:
    if not np.isfinite(x).all():
        raise ValueError("sample contains NaN or inf")
    return x


def pad4(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Inflationary (4x) random step: pads with noise."""
    return np.concatenate([x, rng.random(3 * len(x)).astype(x.dtype)])


def crop_quarter(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Deflationary (1/4) random step."""
    n = max(1, len(x) // 4)
    start = int(rng.integers(0, len(x) - n + 1))
    return x[start : start + n].copy()


class VecSource:
    def __init__(self, n: int, dim: int = 4096) -> None:
        self.n = n
        self.dim = dim

    def __len__(self) -> int:
        return self.n

    def load(self, i: int) -> np.ndarray:
        return np.full(self.dim, i, dtype=np.float32)


def jitter(x: np.ndarray, rng: np.random.Generator) -> dict:
    """A random step drawing from its ``rng`` and from the global generators (re-seeded per
    step in worker processes and remote workers): a sample of a tensor, an array and a number."""
    import random

    time.sleep(0.02)  # simulated work
    return {"t": torch.from_numpy(x) + torch.rand(3), "a": x * rng.random(1).astype(np.float32),
            "n": random.random(), "i": int(x[0])}


def wait_at_gate(gate: str, held: str | None = None) -> None:
    """Wait while a test holds an exclusive ``flock`` on the file ``gate`` (no file: no gate,
    or the test has opened it). With ``held``, a process that waits leaves a file named by its
    pid in that folder, so the test knows which processes hold a sample."""
    try:
        g = open(gate)  # noqa: SIM115 - closed by the with below
    except FileNotFoundError:  # checking for the file first would race the test removing it
        return
    with g:
        if held is not None:
            open(os.path.join(held, str(os.getpid())), "w").close()
        fcntl.flock(g, fcntl.LOCK_SH)  # blocks while the test holds LOCK_EX


def gated_jitter(gate: str, held: str, x: np.ndarray, rng: np.random.Generator) -> dict:
    """``jitter``, first waiting at the gate (``wait_at_gate``)."""
    wait_at_gate(gate, held)
    return jitter(x, rng)


def fail_on_7(x: Any) -> Any:
    if int(np.asarray(x["i"])) == 7:
        raise ValueError("bad sample 7")
    return x


def cpu_work(rounds: int = 4) -> None:
    """Simulated work (about 0.3 ms of CPU for 4 ``rounds``): makes a step's output worth
    storing in the sample cache and looking up, even in Redis."""
    m = np.ones((32, 32))
    for _ in range(rounds):
        np.linalg.svd(m)


def busy(x: np.ndarray) -> np.ndarray:
    """30 ms of simulated work (a sleep: more Ray workers add real capacity on 2 cores)."""
    time.sleep(0.03)
    return x * 2


def ray_node() -> str:
    """The id of the Ray node whose process calls this ("" in a process not connected to
    Ray; a local worker forked from a connected training process says the training host's)."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ""
    return ray.get_runtime_context().get_node_id()


def on_node(key: str, x: dict) -> dict:
    """A step adding ``{key: ray_node()}`` to the sample (a dict): which node ran it."""
    return {**x, key: ray_node()}


def busy_on_node(x: np.ndarray) -> dict:
    """``busy`` (30 ms), its output as ``"x"`` and the node that ran it as ``"node"``
    (``ray_node``)."""
    return {"x": busy(x), "node": ray_node()}


def tweak(d: dict, rng: np.random.Generator) -> dict:
    """A second random step on ``jitter``'s output (run locally after a split)."""
    return {**d, "t": d["t"] * float(rng.random()), "n2": float(np.random.random())}


def slow_on_4(x: Any) -> Any:
    """Slow (100 ms) on every 4th sample, instant on the others."""
    if int(np.asarray(x["i"] if isinstance(x, dict) else x[0])) % 4 == 0:
        time.sleep(0.1)
    return x


class Compose:
    """A Compose-like transform (torchvision's shape, without torchvision): ``transforms``."""

    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


def ran_at(key: str, seconds: float, x: Any) -> dict:
    """A step recording where it ran: ``{key: (process id, get_worker_info().id or -1)}``
    added to the sample (a dict with its index ``"i"``; the source's array starts one), after
    ``seconds`` of simulated work."""
    time.sleep(seconds)
    info = torch.utils.data.get_worker_info()
    d = x if isinstance(x, dict) else {"i": int(x[0])}
    return {**d, key: (os.getpid(), info.id if info is not None else -1)}


def close_while_next_waits(loader: Any, it: Any, under_way: threading.Event,
                           bound: int) -> None:
    """Close ``loader`` from another thread once ``under_way`` is set (the dataset sets it
    when the epoch is under way), while this thread waits in ``next(it)`` at most ``bound``
    times; raises what that ``next()`` raises, and checks the closer ended."""
    closer = threading.Thread(target=lambda: under_way.wait(60) and loader.close())
    closer.start()
    try:
        for _ in range(bound):
            next(it)
    finally:
        closer.join(60)
        assert not closer.is_alive()


class LogSaid(logging.Handler):
    """``said`` is set once the logger ``name`` emits a record whose message contains
    ``text``: a test waits on it instead of polling the captured log. ``with LogSaid(...)``
    attaches it and takes it off again."""

    def __init__(self, text: str, name: str = "headrace") -> None:
        super().__init__(logging.DEBUG)
        self.text, self.logger = text, logging.getLogger(name)
        self.said = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.said.set()

    def __enter__(self) -> LogSaid:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


class Twice(namedtuple("Twice", "first second")):
    """A named tuple made from one value, held twice: built from its two fields, as the
    transport rebuilds named tuples (and torch's pickling and collate do), it raises."""

    def __new__(cls, value):
        return super().__new__(cls, value, value)


def stop_torch_workers(it: Any) -> None:
    """Stop the workers of torch's DataLoader iterator ``it`` now, after one raised a worker's
    error. That error holds the iterator in a reference cycle (``ExceptionWrapper.reraise``
    keeps the exception it raises in a local of a frame its traceback holds), so only the
    garbage collector stopped them, and torch's shutdown from there waited out its 5 s join
    for each worker (a test's teardown took 10 s)."""
    it._shutdown_workers()
