"""The scheduler thread gives the GIL way only while the training thread leaves ``next()``
(``runtime/waiter.py``): no give-way is pending once ``next()`` returned or raised, or it would
hold back the pass a later ``next()`` waits for (2 ms per wake-up)."""

import torch

import headrace as hr
from tests.helpers import IndexDataset


def pending(it) -> bool:
    return it.scheduler._waiter._leaving


def test_none_pending_after_each_next(no_leaks):
    loader = hr.DataLoader(IndexDataset(12), batch_size=3, num_workers=1)
    it, got = iter(loader), []
    for batch in it:
        assert not pending(it)
        got += batch.tolist()
    assert sorted(got) == list(range(12))


def failing_collate(samples):
    if 5 in samples:
        raise ValueError("cannot collate 5")
    return torch.tensor(samples)


def test_none_pending_after_a_collate_fn_error(no_leaks):
    loader = hr.DataLoader(IndexDataset(12), batch_size=3, num_workers=1, in_order=True,
                           collate_fn=failing_collate)
    it, got, raised = iter(loader), [], 0
    for _ in range(20):  # bounded: 4 batches and the end
        try:
            got += next(it).tolist()
        except StopIteration:
            break
        except hr.StepError as e:
            assert e.step == "collate_fn"
            raised += 1
        assert not pending(it)  # the error path of take() woke the scheduler, not on the way out
    assert raised == 1 and got == [0, 1, 2, 6, 7, 8, 9, 10, 11]
