"""AutoOrder's order checked on every sample it runs (``pipeline/order_guard.py``): a sample on
which a moved step changes the shape after all is delivered as the declared order computes it."""

import numpy as np
import pytest

import headrace as hr
from headrace.profiler.store import ProfileStore
from tests.integration.test_planning import Rows, crop_16, pad_to_32

pytestmark = pytest.mark.integration


def _run(reorder: bool, workers: int, executor: str, store=False) -> tuple[list, list, str]:
    pipe = hr.Pipeline(Rows(), [hr.step(pad_to_32, random=True), hr.step(crop_16, random=True)])
    loader = hr.DataLoader(pipe, batch_size=32, num_workers=workers, options=hr.Options(
        seed=4, profile_store=store, cache=None, reorder=reorder, executor=executor))
    try:
        epochs, orders = [], []
        for _ in range(3):
            epochs.append(np.concatenate([b.numpy() for b in loader]))
            orders.append([s.name for s in loader.planning.executed.steps])
        return epochs, orders, loader.explain()
    finally:
        loader.close()


@pytest.mark.parametrize("workers,executor", [(0, "processes"), (2, "processes"),
                                              (2, "threads")])
def test_an_order_that_changes_the_shape_delivers_what_the_declared_order_computes(
        workers, executor, no_leaks):
    # the pad keeps the 64-row samples of the declared order, so AutoOrder moves the crop before
    # it; there it pads every 16-row crop to 32 rows. Before the check, epoch 2 was delivered
    # 32 rows wide (a bug hunt: every sample of the epoch in the other shape)
    got, orders, text = _run(True, workers, executor)
    want, declared, _ = _run(False, workers, executor)
    # (the order each epoch ran) AutoOrder's order ran in epoch 2, then the declared one
    assert orders == [["pad_to_32", "crop_16"], ["crop_16", "pad_to_32"],
                      ["pad_to_32", "crop_16"]]
    assert declared == [["pad_to_32", "crop_16"]] * 3
    for e in range(3):  # ordered by index: workers finish out of order
        np.testing.assert_array_equal(got[e][np.argsort(got[e][:, 0, 0], kind="stable")],
                                      want[e][np.argsort(want[e][:, 0, 0], kind="stable")])
        assert got[e].shape == (320, 16, 8)
    assert "did not hold: pad_to_32 changed a sample's dtype or shape after it was moved " \
           "across crop_16" in text, text


class Shrinking:
    """64-row samples, until the test sets ``rows``."""

    rows = 64

    def __len__(self) -> int:
        return 320

    def load(self, i: int) -> np.ndarray:
        return np.full((self.rows, 8), i, dtype=np.float32)


def pad_to_8(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    if x.shape[0] >= 8:
        return x
    return np.concatenate([x, np.full((8 - x.shape[0], x.shape[1]), rng.random(), x.dtype)])


def crop_to_16(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    top = int(rng.integers(0, max(1, x.shape[0] - 16 + 1)))
    return x[top:top + 16].copy()


def test_an_order_validated_and_kept_goes_back_once_a_sample_breaks_it(tmp_path, no_leaks):
    # the pad kept the 64-row and 16-row samples of both orders, so AutoOrder's crop-first
    # order was validated and kept; 4-row samples came later (epoch 3), which the moved pad
    # pads after the crop: those samples are the declared order's, the order goes back for
    # the rest of the run, and the job's next run does not run it again
    def run(reorder: bool, store) -> tuple[list, list]:
        source = Shrinking()
        pipe = hr.Pipeline(source, [hr.step(pad_to_8, random=True),
                                    hr.step(crop_to_16, random=True)])
        loader = hr.DataLoader(pipe, batch_size=32, num_workers=0, options=hr.Options(
            seed=4, profile_store=store, cache=None, reorder=reorder))
        try:
            epochs, orders = [], []
            for e in range(4):
                source.rows = 64 if e < 2 else 4
                epochs.append(np.concatenate([b.numpy() for b in loader]))
                orders.append([s.name for s in loader.planning.executed.steps])
            return epochs, orders
        finally:
            loader.close()

    store = tmp_path / "store.sqlite"
    got, orders = run(True, store)
    want, _ = run(False, False)
    moved, declared = ["crop_to_16", "pad_to_8"], ["pad_to_8", "crop_to_16"]
    assert orders == [declared, moved, moved, declared]
    for e in range(4):
        np.testing.assert_array_equal(got[e], want[e])
    (key,) = ProfileStore(store).keys()
    assert ProfileStore(store).get(key).rejected_orders == (tuple(moved),)
    assert run(True, store)[1] == [declared] * 4


@pytest.mark.parametrize("workers", [0, 2])
def test_an_order_a_sample_broke_in_the_runs_last_epoch_is_stored_as_rejected(
        workers, tmp_path, no_leaks):
    # a two-epoch job: its second (last) epoch ran AutoOrder's order and each sample broke it;
    # no epoch boundary followed, so the rejection was never recorded, and every later run of
    # the job ran each sample twice for an epoch again (a review's find)
    store = tmp_path / "store.sqlite"

    def run() -> list:
        pipe = hr.Pipeline(Rows(), [hr.step(pad_to_32, random=True),
                                    hr.step(crop_16, random=True)])
        loader = hr.DataLoader(pipe, batch_size=32, num_workers=workers, options=hr.Options(
            seed=4, profile_store=store, cache=None))
        try:
            orders = []
            for _ in range(2):
                assert {b.shape[1] for b in loader} == {16}
                orders.append([s.name for s in loader.planning.executed.steps])
            return orders
        finally:
            loader.close()

    assert run() == [["pad_to_32", "crop_16"], ["crop_16", "pad_to_32"]]
    (key,) = ProfileStore(store).keys()
    assert ProfileStore(store).get(key).rejected_orders == (("crop_16", "pad_to_32"),)
    assert run() == [["pad_to_32", "crop_16"]] * 2
