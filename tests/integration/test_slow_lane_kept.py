"""A sample over the timeout whose partial value would not arrive as it is stays on its worker.

A hand-off sends the value between two steps to another worker. A value that does not pickle
(an open file read by the next step), or whose parts share memory (a view of another part, the
same tensor twice), would fail there or lose the sharing a later in-place step relies on: such a
sample is finished by its own worker (``runtime/faithful.py``). Every test compares the loader
with hand-offs forced (a 5 ms timeout, 20 ms steps) against ``handoff=False``, exactly.
"""

import time

import numpy as np
import pytest
import torch

import headrace as hr

pytestmark = pytest.mark.integration

N = 24
FORCED = hr.TimeoutConfig(fixed_s=0.005)


class Full:
    """Sample ``i``: an 8x8 tensor or array of ``i``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return N

    def load(self, i: int):
        return torch.full((8, 8), float(i)) if self.kind == "torch" else np.full((8, 8), float(i))


def split(x):
    """Even samples: a view of the image and the image itself under other keys; odd samples:
    copies (nothing shared, so those still move)."""
    time.sleep(0.02)  # simulated work, over the timeout
    i = int(x[0, 0])
    if i % 2 == 0:
        return {"i": i, "img": x, "top": x[:2], "same": x}
    return {"i": i, "img": x, "top": x[:2].copy() if isinstance(x, np.ndarray) else x[:2].clone(),
            "same": x.copy() if isinstance(x, np.ndarray) else x.clone()}


def brighten(d):
    time.sleep(0.02)  # simulated work: enough left for a move to pay
    d["img"] *= 2  # in place: "top" and "same" see it where they share its memory
    return d


def sums(d):
    return torch.tensor([d["i"], float(d["img"].sum()), float(d["top"].sum()),
                         float(d["same"].sum())], dtype=torch.float64)


def _epochs(pipe: hr.Pipeline, handoff: bool, executor: str = "processes", epochs: int = 1):
    opts = hr.Options(seed=3, handoff=handoff, timeout=FORCED, cache=None, profile_store=False,
                      executor=executor)
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, options=opts)
    try:
        out = [torch.cat(list(loader)) for _ in range(epochs)]
        return out, [e.slow_samples for e in loader.stats().epochs]
    finally:
        loader.close()


@pytest.mark.parametrize(("kind", "executor"), [("torch", "processes"), ("numpy", "processes"),
                                                ("numpy", "threads")])
def test_a_sample_whose_parts_share_memory_is_not_handed_off(kind, executor, no_leaks):
    # threads deep-copy a handed-off value: same tensor objects and tensor views survive
    # that, NumPy views do not
    pipe = hr.Pipeline(Full(kind), [hr.step(split), hr.step(brighten), hr.step(sums)])
    moved, slow = _epochs(pipe, True, executor)
    kept, _ = _epochs(pipe, False, executor)
    assert torch.equal(moved[0], kept[0]), (moved[0] != kept[0]).any(1).nonzero().flatten()
    even = moved[0][moved[0][:, 0] % 2 == 0]
    assert torch.equal(even[:, 2] * 4, even[:, 1]) and torch.equal(even[:, 3], even[:, 1])
    assert slow[0] > 0  # odd samples, which share nothing, were still handed off


class OpenFiles:
    """Sample ``i``: the path of a file holding 16 float32 values from ``16 * i``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return N

    def load(self, i: int):
        return self.path, i


def open_reader(x):
    """An "open" step (a video container, an HDF5 file): its value does not pickle."""
    time.sleep(0.02)  # simulated work, over the timeout
    path, i = x
    f = open(path, "rb")  # noqa: SIM115 - closed by the next step
    f.seek(i * 64)
    return f


def read_values(f):
    time.sleep(0.02)  # simulated work: enough left for a move to pay
    with f:
        return torch.from_numpy(np.frombuffer(f.read(64), dtype=np.float32).copy())


@pytest.mark.parametrize("executor", ["processes", "threads"])
def test_a_sample_whose_value_does_not_pickle_is_finished_by_its_worker(executor, tmp_path,
                                                                        caplog, no_leaks):
    path = tmp_path / "values.f32"
    np.arange(N * 16, dtype=np.float32).tofile(path)
    pipe = hr.Pipeline(OpenFiles(str(path)), [hr.step(open_reader), hr.step(read_values)])
    with caplog.at_level("WARNING", logger="headrace"):
        moved, _ = _epochs(pipe, True, executor, epochs=2)
    kept, _ = _epochs(pipe, False, executor, epochs=2)
    assert all(torch.equal(a, b) for a, b in zip(moved, kept, strict=True))
    assert torch.equal(moved[1].flatten(), torch.arange(N * 16, dtype=torch.float32))
    if executor == "threads":  # said, with the step and why (a worker process says it on
        # its own stderr, out of this process's log capture)
        assert "not handed off to another worker after step 'open_reader': it does not pickle" \
            in caplog.text


class NoCopy:
    """Pickles, but refuses a deep copy (what a worker thread makes of a handed-off value)."""

    def __init__(self, i: int) -> None:
        self.i = i

    def __deepcopy__(self, memo):
        raise RuntimeError(f"sample {self.i} refuses a deep copy")


def wrap(i):
    time.sleep(0.02)  # simulated work, over the timeout
    return NoCopy(i)


def unwrap(x):
    time.sleep(0.02)  # simulated work: enough left for a move to pay
    return torch.tensor([x.i])


def test_a_thread_that_cannot_copy_a_handed_off_value_fails_that_sample_not_the_epoch(no_leaks):
    # the copy raised in the worker thread, which died; its samples went to the next thread,
    # which died the same way: tens of thousands of "worker died" lines and no end of epoch
    class Indices:
        def __len__(self) -> int:
            return 8

        def load(self, i: int) -> int:
            return i

    pipe = hr.Pipeline(Indices(), [hr.step(wrap), hr.step(unwrap)])
    opts = hr.Options(seed=3, timeout=FORCED, cache=None, profile_store=False,
                      executor="threads")
    loader = hr.DataLoader(pipe, batch_size=1, num_workers=2, options=opts)
    got, errors = [], []
    try:
        it = iter(loader)
        for _ in range(8 + 1):  # each sample once, delivered or raised; then the end
            try:
                got.append(int(next(it)))
            except hr.StepError as e:
                errors.append(e)
            except StopIteration:
                break
        else:
            pytest.fail("the epoch did not end")
    finally:
        loader.close()
    assert errors, "no sample was handed off"
    assert sorted(got + [e.index for e in errors]) == list(range(8))
    for e in errors:  # the user's exception, at the hand-off, naming the sample
        assert e.step == "transport" and isinstance(e, RuntimeError)
        assert f"sample {e.index} refuses a deep copy" in str(e)


def test_a_kept_sample_is_said_once_over_fresh_workers_of_several_epochs(tmp_path, no_leaks):
    # each worker process kept its own "said" set: workers started anew each epoch said it
    # again, 2 workers over 4 epochs up to 8 times. Forked workers write to the file handler
    # they inherit (a worker's records do not reach this process's log capture).
    import logging

    path = tmp_path / "headrace.log"
    handler = logging.FileHandler(path)
    logger = logging.getLogger("headrace")
    logger.addHandler(handler)
    pipe = hr.Pipeline(Full("torch"), [hr.step(split), hr.step(brighten), hr.step(sums)])
    opts = hr.Options(seed=3, timeout=FORCED, cache=None, profile_store=False)
    loader = hr.DataLoader(pipe, batch_size=4, num_workers=2, multiprocessing_context="fork",
                           options=opts)
    try:
        for _ in range(4):
            assert sorted(int(i) for i in torch.cat(list(loader))[:, 0]) == list(range(N))
    finally:
        loader.close()
        logger.removeHandler(handler)
        handler.close()
    said = [line for line in path.read_text().splitlines() if "not handed off" in line]
    assert len(said) == 1, said
    assert "after step 'split'" in said[0]
