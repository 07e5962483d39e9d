"""``Remote(read_source=False)`` needs steps after ``load`` to ship to the remote workers."""

from __future__ import annotations

import pytest

import headrace as hr
from headrace.errors import PipelineError
from headrace.remote.session import RemoteSession
from tests.helpers import ArraySource, Compose, IndexDataset


def add_one(x):
    return x + 1


class Composed(IndexDataset):
    """A dataset whose transforms run inside ``__getitem__`` (measured in place)."""

    def __init__(self, n):
        super().__init__(n)
        self.transform = Compose([add_one, add_one])

    def __getitem__(self, i):
        return self.transform(super().__getitem__(i))


@pytest.mark.parametrize("dataset", [IndexDataset(8), Composed(8)])
def test_read_source_false_over_steps_all_inside_getitem_raises(dataset):
    # the training host ran every sample whole in its proxy threads: nothing remote, and
    # the samples' draws from the global generators were the training loop's, unseeded
    pipeline = hr.DataLoader(dataset).pipeline
    session = RemoteSession(hr.Remote(read_source=False))
    with pytest.raises(PipelineError, match="nothing would run remotely"):
        session.prepare(pipeline, 1, True)


def test_read_source_false_with_steps_after_load_prepares():
    pipeline = hr.Pipeline(ArraySource(8), [hr.step(add_one, name="add_one")])
    assert RemoteSession(hr.Remote(read_source=False)).prepare(pipeline, 1, True) is True
    assert RemoteSession(hr.Remote()).prepare(hr.DataLoader(IndexDataset(8)).pipeline,
                                              1, True) is True
