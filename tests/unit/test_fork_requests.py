"""The workers the scheduler thread asks for, as the training thread forks them
(``runtime/forks.py``): in the order asked, once, and when it has no batch to take or a
request has waited ``DEFER_S``."""

from headrace.runtime.forks import DEFER_S, StartRequests


def test_requests_come_out_once_in_the_order_asked_and_wake_the_training_thread():
    r = StartRequests()
    woken = []
    r.on_asked = lambda: woken.append(len(r))
    r.ask(None, 3)
    r.ask(1, None)
    assert woken == [1, 2] and len(r) == 2
    assert r.take() == [(None, 3), (1, None)]
    assert len(r) == 0 and r.take() == []
    r.ask(None, None)
    r.drop()
    assert r.take() == [] and not r.due(idle=True)


def test_forks_wait_for_an_idle_training_thread_or_for_the_oldest_request_to_wait_long():
    r = StartRequests()
    assert not r.due(idle=True)  # nothing asked
    r.ask(None, None)
    t0 = r._since
    assert r.due(idle=True, now=t0)  # no batch to take: fork now
    assert not r.due(idle=False, now=t0 + DEFER_S / 2)  # a batch is ready: not yet
    r.ask(None, None)  # a later request does not restart the wait
    assert r.due(idle=False, now=t0 + DEFER_S)
    r.take()
    r.ask(None, None)  # a new first request does
    assert not r.due(idle=False, now=r._since + DEFER_S / 2)
