"""``Starts.hold`` (``runtime/starts.py``), as a pure object over stand-in worker handles: the
first batch of a ``worker_init_fn``'s epoch waits for the workers' starts, at most
``START_HOLD_S`` each, and a worker it stops waiting for is named once."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from headrace.runtime import starts


def _worker(slot: int, started_s_ago: float, ready: bool = False) -> SimpleNamespace:
    return SimpleNamespace(ready=ready, is_thread=False, external=False, retiring=False,
                           slot=slot, started=time.monotonic() - started_s_ago)


def test_a_worker_past_the_hold_is_named_once_while_a_later_one_still_holds(caplog):
    stuck = _worker(0, starts.START_HOLD_S + 1)
    later = _worker(1, 1.0)
    pool = SimpleNamespace(worker_init_fn=lambda i: None, starting=False,
                           workers={0: stuck, 1: later})
    hold = starts.Starts(pool, lambda w, msg: None)
    with caplog.at_level(logging.WARNING, logger="headrace"):
        assert [hold.hold() for _ in range(5)] == [True] * 5  # every scheduler pass
        later.ready = True
        assert hold.hold() is False
    named = [r for r in caplog.records if "worker_init_fn has not returned" in r.getMessage()]
    assert len(named) == 1 and "worker 0" in named[0].getMessage()
    assert "does not wait for it" in named[0].getMessage()


def test_without_a_worker_init_fn_nothing_is_held():
    pool = SimpleNamespace(worker_init_fn=None, starting=True, workers={})
    assert starts.Starts(pool, lambda w, msg: None).hold() is False
