"""How remote results count (``remote/counts.py``), without Ray: what a proxy notes and the
scheduler takes."""

from __future__ import annotations

from types import SimpleNamespace

from headrace.remote.counts import AT_SPLIT, HANDED_OFF, OFFLOADED, Outcomes, RemoteCounts


def in_flight(*samples: tuple[int, int, int]) -> dict[int, SimpleNamespace]:
    """``recs`` as the scheduler holds them: task id -> a record whose task names its sample."""
    return {tid: SimpleNamespace(task=SimpleNamespace(epoch=e, sample=i, draw=d))
            for tid, (e, i, d) in enumerate(samples)}


def test_a_sample_back_at_a_split_and_finished_remotely_after_a_replan_counts_once():
    counts = RemoteCounts()
    first, second = Outcomes(counts._took), Outcomes(counts._took)  # two remote workers
    first.expect(5, AT_SPLIT, (0, 7, 0))  # back at the old split
    first.took(5)
    second.expect(5, OFFLOADED, (0, 7, 0))  # the split moved later: the rest, remotely
    second.took(5)
    assert counts.remote_samples == 1
    second.expect(9, OFFLOADED, (0, 7, 1))  # the index's second draw is another sample
    second.took(9)
    assert counts.remote_samples == 2


def test_handed_off_over_the_timeout_after_a_split_still_counts_once():
    counts = RemoteCounts()
    for kind in (AT_SPLIT, HANDED_OFF, OFFLOADED):
        counts._took(kind, (1, 3, 0))
    assert (counts.remote_samples, counts.handed_off_remote) == (1, 1)


def test_samples_counted_at_a_split_are_forgotten_once_no_longer_in_flight():
    counts = RemoteCounts()
    for i in range(40):
        counts._took(AT_SPLIT, (0, i, 0))  # local workers finish them: never taken again
    counts.forget_settled(in_flight(*((0, i, 0) for i in range(20))))  # 40 <= 2 x 20 + 16
    assert len(counts._at_split) == 40
    counts.forget_settled(in_flight((0, 39, 0), (0, 100, 0)))
    assert counts._at_split == {(0, 39, 0)}
    counts._took(OFFLOADED, (0, 39, 0))  # still in flight: still counted once
    assert counts.remote_samples == 40
