"""Device prefetch bookkeeping with a fake device: order, in-flight bound, delivery on return."""

from collections import deque

import pytest
import torch

from headrace.runtime.prefetch import DevicePrefetcher, resolve_device
from tests.device_fakes import FakeFence


class FakeCopier:
    """A 'device' copy is a clone; records the order of copies and hand-overs."""

    def __init__(self) -> None:
        self.copies: list[int] = []
        self.handed: list[int] = []
        self.fences: dict[int, FakeFence] = {}

    def copy(self, batch):
        out = {"x": batch["x"].clone(), "id": batch["id"]}
        fence = FakeFence()
        self.copies.append(batch["id"])
        self.fences[batch["id"]] = fence
        return out, fence

    def hand_over(self, batch, fence) -> None:
        assert fence is self.fences[batch["id"]]  # the fence of this very batch's copy
        fence.done = True
        self.handed.append(batch["id"])


class FakeEpoch:
    """Batches become ready when the test releases them; the end is reached after ``n``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ready: deque = deque()
        self.released = 0
        self.delivered: list[int] = []
        self.closed = False
        self.finished = False
        self.origin = "origin"

    def release(self, k: int) -> None:
        for _ in range(k):
            i = self.released
            self.ready.append(({"x": torch.full((2,), float(i)), "id": i}, [2 * i, 2 * i + 1]))
            self.released += 1

    def take(self, block: bool = True):
        if self.ready:
            return self.ready.popleft()
        if self.released < self.n and block:
            self.release(1)  # the blocking call waits for the next batch
            return self.ready.popleft()
        if not block:
            return None
        self.closed = self.finished = True
        raise StopIteration

    def deliver(self, positions) -> None:
        self.delivered.extend(positions)

    def stats(self):
        return "stats"

    def close(self, replaced: bool = False) -> None:
        self.closed = True


def test_order_kept_and_in_flight_bounded():
    epoch, copier = FakeEpoch(10), FakeCopier()
    fenced = []
    pf = DevicePrefetcher(epoch, copier, lambda ts, f: fenced.append((len(ts), f)), depth=2)
    epoch.release(6)  # more ready than the depth allows
    first = next(pf)
    assert first["id"] == 0
    assert pf.in_flight == 2 and copier.copies == [0, 1, 2]  # DEPTH behind the returned one
    assert epoch.delivered == [0, 1]  # copied ahead is not delivered
    got = [first["id"]] + [b["id"] for b in pf]
    assert got == list(range(10)) and copier.handed == list(range(10))
    assert epoch.delivered == list(range(20))
    assert len(fenced) == 10 and all(n == 1 for n, _ in fenced)  # each copy fences its host batch
    assert epoch.closed


def test_next_never_waits_for_batches_behind_the_one_it_returns():
    epoch, copier = FakeEpoch(3), FakeCopier()
    pf = DevicePrefetcher(epoch, copier, depth=2)
    b = next(pf)  # nothing ready: the blocking take gets batch 0 only
    assert b["id"] == 0 and pf.in_flight == 0
    epoch.release(1)
    assert pf.fill() and pf.in_flight == 1 and not pf.fill()
    assert next(pf)["id"] == 1 and epoch.delivered == [0, 1, 2, 3]
    assert [x["id"] for x in pf] == [2]


def test_close_drops_batches_copied_ahead_undelivered():
    epoch, copier = FakeEpoch(5), FakeCopier()
    pf = DevicePrefetcher(epoch, copier, depth=3)
    epoch.release(4)
    next(pf)
    assert pf.in_flight == 3
    pf.close()
    assert pf.closed and pf.in_flight == 0 and epoch.delivered == [0, 1]
    assert pf.origin == "origin" and pf.stats() == "stats" and pf.delivered is epoch.delivered


class Interrupted(FakeEpoch):
    """Delivering its second batch is interrupted once (a Ctrl-C: ``EpochBase.deliver`` then
    leaves it undelivered)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.calls = 0

    def deliver(self, positions) -> None:
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt
        super().deliver(positions)


def test_a_batch_whose_delivery_was_interrupted_comes_next():
    epoch, copier = Interrupted(4), FakeCopier()
    pf = DevicePrefetcher(epoch, copier, depth=2)
    epoch.release(4)
    assert next(pf)["id"] == 0
    with pytest.raises(KeyboardInterrupt):
        next(pf)
    assert [b["id"] for b in pf] == [1, 2, 3]  # lost before: the epoch went on without it
    assert epoch.delivered == list(range(8))


def test_depth_validated():
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher(FakeEpoch(1), FakeCopier(), depth=0)


def test_device_must_be_cuda_or_the_cpu():
    assert resolve_device(None) is None
    for cpu in ("cpu", "cpu:0", torch.device("cpu")):  # no copy: batches are in host memory
        assert resolve_device(cpu) is None
    with pytest.raises(ValueError, match="CUDA device"):
        resolve_device("meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_refused_without_cuda():
    with pytest.raises(ValueError, match="not available"):
        resolve_device("cuda")


def test_options_device_validated():
    import headrace as hr

    with pytest.raises(ValueError, match=r"Options\(device='nonsense'\): .*"):
        hr.Options(device="nonsense")  # torch's own message for a malformed device, named
    assert hr.Options(device=torch.device("cuda", 0)).device == torch.device("cuda", 0)
    if not torch.accelerator.is_available():  # an index: torch's words named no argument
        with pytest.raises(ValueError, match=r"Options\(device=0\)"):
            hr.Options(device=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_loader_refuses_a_device_it_cannot_reach():
    import headrace as hr

    with pytest.raises(ValueError, match="not available"):
        hr.DataLoader(list(range(8)), batch_size=2, options=hr.Options(device="cuda"))


class FailingEpoch(FakeEpoch):
    """Batch ``bad``'s take raises (its collate_fn failed: the epoch iterator's ``take``
    settles the batch and raises its error, also a non-blocking take's)."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def take(self, block: bool = True):
        got = super().take(block)
        if got is not None and got[0]["id"] == self.bad:
            raise ValueError(f"cannot collate batch {self.bad}")
        return got


def test_a_batch_error_taken_ahead_comes_in_its_turn():
    # it was raised by the take that met it, before the batches taken ahead of it
    epoch = FailingEpoch(6, bad=2)
    pf = DevicePrefetcher(epoch, FakeCopier(), depth=2)
    epoch.release(6)
    seen = []
    for _ in range(10):
        try:
            seen.append(next(pf)["id"])
        except StopIteration:
            break
        except ValueError as e:
            seen.append(str(e))
    assert seen == [0, 1, "cannot collate batch 2", 3, 4, 5]
    assert epoch.delivered == [0, 1, 2, 3, 6, 7, 8, 9, 10, 11]


class ClosingEpoch(FailingEpoch):
    """Once closed, every take ends it (as a closed epoch's next() does)."""

    def take(self, block: bool = True):
        if self.closed:
            raise StopIteration
        return super().take(block)


def test_a_batch_error_held_back_is_dropped_when_the_epoch_closes():
    """loader.close() (or a newer iter()) closes the prefetcher: a batch's error held back for
    its turn behind the batches copied ahead outlived it, and the next next() raised that old
    error, not what a closed epoch raises (a hunt)."""
    epoch = ClosingEpoch(6, bad=2)
    pf = DevicePrefetcher(epoch, FakeCopier(), depth=2)
    epoch.release(6)
    assert next(pf)["id"] == 0 and pf._error is not None  # batch 2's, taken ahead of its turn
    pf.close()
    with pytest.raises(StopIteration):
        next(pf)


def test_a_batch_holding_tensors_in_an_object_the_copy_does_not_look_into_is_warned_once():
    """Options(device=) copies the tensors of dicts, lists, tuples and namedtuples: a dataclass,
    a UserDict or a batch class with its own .to() came back with its tensors in host memory,
    without a word (a hunt, the copier's walk on a stand-in device)."""
    import dataclasses
    import warnings
    from collections import UserDict

    from headrace.runtime.prefetch import unmoved

    @dataclasses.dataclass
    class Batch:
        x: torch.Tensor

    class Own:
        def to(self, device, non_blocking=False):
            return self

    assert unmoved({"x": torch.ones(2), "names": ["a"], "n": 3, "none": None}) is None
    assert unmoved({"b": Batch(torch.ones(2))}) == "Batch"
    assert unmoved([UserDict(x=torch.ones(2))]) == "UserDict"
    assert unmoved((Own(),)) == "Own"

    class Wrapped(FakeEpoch):
        def take(self, block: bool = True):
            got = super().take(block)
            return None if got is None else ({"x": got[0]["x"], "id": got[0]["id"],
                                              "extra": Batch(got[0]["x"])}, got[1])

    epoch = Wrapped(3)
    pf = DevicePrefetcher(epoch, FakeCopier(), depth=1)
    epoch.release(3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert [b["id"] for b in pf] == [0, 1, 2]
    texts = [str(w.message) for w in seen if "Options(device=...)" in str(w.message)]
    assert len(texts) == 1 and "holds a Batch" in texts[0], texts
