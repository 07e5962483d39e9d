"""Which resumed samples a remote worker may take (``ProxyOptions.runs``): never one its proxy
handed back at step 0 because the value it loaded could not be shipped (``LoadLocally``)."""

from __future__ import annotations

import headrace as hr
from headrace.remote.proxy_options import LoadLocally, ProxyOptions
from headrace.runtime.worker import Task


def test_a_sample_handed_back_at_the_load_goes_to_local_workers_only():
    opts = ProxyOptions(hr.Remote(read_source=False), pipeline=None, steps=3, processes=True)
    fresh = Task(1, 4, 0, None, 0, 0, True)
    assert opts.runs(fresh)  # a retry of a fresh sample: any worker
    back = fresh._replace(payload=LoadLocally("it does not pickle"), may_hand_off=False)
    assert not opts.runs(back)  # else its proxy loads it again, and hands it back again
    assert not opts.runs(back._replace(tid=9))  # moved to an idle worker (Dispatcher._steal)
