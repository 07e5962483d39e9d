"""The workers the scheduler thread asks for, as the training thread forks them
(``runtime/forks.py``): once each, replacements first, then in the order asked; when it has no
batch to take or a request has waited ``DEFER_S``; withdrawn when the scaler lowers its count."""

import time

from headrace.runtime.forks import DEFER_S, StartRequests


def _all(r: StartRequests) -> list:
    out = []
    while (req := r.pop()) is not None:
        out.append(req)
    return out


def test_requests_come_out_once_replacements_first_and_wake_the_training_thread():
    r = StartRequests()
    woken = []
    r.on_asked = lambda: woken.append(len(r))
    r.ask(None, 3)  # the scaler's, asked before worker 1 died...
    r.ask(1, None)  # ...is not given worker 1's slot: the replacement goes first
    r.ask(None, 4)
    assert woken == [1, 2, 3] and len(r) == 3
    assert _all(r) == [(1, None), (None, 3), (None, 4)]
    assert len(r) == 0 and r.pop() is None
    r.ask(None, None)
    r.drop()
    assert r.pop() is None and not r.due(idle=True)


def test_a_lowered_count_withdraws_the_latest_requests_for_any_slot_not_replacements():
    r = StartRequests()
    for req in [(None, 2), (0, None), (None, 3), (None, 4)]:
        r.ask(*req)
    assert r.cancel(2) == 2
    assert _all(r) == [(0, None), (None, 2)]
    r.ask(0, None)
    assert r.cancel(1) == 0 and r.cancel(-1) == 0 and len(r) == 1


def test_forks_wait_for_an_idle_training_thread_or_for_the_oldest_request_to_wait_long():
    r = StartRequests()
    assert not r.due(idle=True)  # nothing asked
    before = time.monotonic()
    r.ask(None, None)
    after = time.monotonic()
    assert r.due(idle=True, now=after)  # no batch to take: fork now
    assert not r.due(idle=False, now=before + DEFER_S / 2)  # a batch is ready: not yet
    before2 = time.monotonic()
    r.ask(None, None)
    after2 = time.monotonic()
    assert r.due(idle=False, now=after + DEFER_S)  # the oldest decides, not the latest
    r.pop()  # once the first is forked, the one left waits from when it was asked
    assert not r.due(idle=False, now=before2 + DEFER_S / 2)
    assert r.due(idle=False, now=after2 + DEFER_S)
