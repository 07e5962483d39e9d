"""The benchmark's minimal reference loader: every sample once, batches as default_collate makes
them, its threads gone after an early break or a failing step."""

import threading
from collections import Counter

import numpy as np
import pytest

import headrace as hr
from headrace.bench.minimal import MinimalLoader
from tests.helpers import ArraySource


def as_dict(x: np.ndarray) -> dict:
    return {"index": int(x[0]), "x": np.full((2, 3), x[0], np.float32)}


def fail_on_7(x: dict) -> dict:
    if x["index"] == 7:
        raise ValueError("bad sample")
    return x


def threads_left() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("headrace-minimal")]


def test_every_sample_once_in_batches_default_collate_would_make():
    order = list(np.random.default_rng(0).permutation(23))
    loader = MinimalLoader(hr.Pipeline(ArraySource(23), [as_dict]), order, batch_size=5,
                           num_workers=3, prefetch_factor=1)
    costs: dict[int, float] = {}
    loader.add_sample_listener(lambda i, s, slow: costs.__setitem__(i, s))
    seen: Counter[int] = Counter()
    sizes = []
    for batch in loader:
        idx = batch["index"].tolist()
        seen.update(idx)
        sizes.append(len(idx))
        assert batch["x"].shape == (len(idx), 2, 3)
        for k, i in enumerate(idx):  # each row holds its own sample
            assert (batch["x"][k] == i).all()
    assert seen == Counter(order)
    assert sorted(sizes) == [3, 5, 5, 5, 5] and len(loader) == 5
    assert sorted(costs) == sorted(order)
    assert threads_left() == []


def test_an_early_break_leaves_no_thread():
    loader = MinimalLoader(hr.Pipeline(ArraySource(200), [as_dict]), range(200), batch_size=4,
                           num_workers=2)
    it = iter(loader)
    first = next(it)
    assert len(first["index"]) == 4
    it.close()  # what a ``break`` out of the for loop does to the generator
    assert threads_left() == []


def test_a_failing_step_raises_with_the_sample_and_stops_the_threads():
    loader = MinimalLoader(hr.Pipeline(ArraySource(20), [as_dict, fail_on_7]), range(20),
                           batch_size=2, num_workers=2)
    with pytest.raises(RuntimeError, match="sample 7: step .fail_on_7. failed") as info:
        for _ in loader:
            pass
    assert "bad sample" in str(info.value)
    assert threads_left() == []


class Counting:
    """A step that counts the samples taken so far."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0

    def __call__(self, x: dict) -> dict:
        with self.lock:
            self.taken += 1
        return x


def test_samples_taken_ahead_of_the_consumer_stay_within_the_bound():
    count = Counting()
    loader = MinimalLoader(hr.Pipeline(ArraySource(200), [as_dict, count]), range(200),
                           batch_size=4, num_workers=2, prefetch_factor=1)
    assert loader.max_in_flight == 10  # headrace's default: max(2 x 4 + 2, 1 x 2 x 4)
    consumed = 0
    for batch in loader:
        consumed += len(batch["index"])
        with count.lock:
            assert count.taken - consumed <= loader.max_in_flight
    assert consumed == 200


def test_an_empty_order_is_an_empty_epoch():
    assert list(MinimalLoader(hr.Pipeline(ArraySource(3), [as_dict]), [], 2, 2)) == []


def test_a_listener_that_raises_reaches_the_consumer():
    loader = MinimalLoader(hr.Pipeline(ArraySource(10), [as_dict]), range(10), 2, 2)

    def listener(i, s, slow):
        raise KeyError(f"listener on {i}")

    loader.add_sample_listener(listener)
    with pytest.raises(KeyError, match="listener on"):
        list(loader)
    assert threads_left() == []
