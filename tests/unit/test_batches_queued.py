"""The training loop's queue occupancy counts batches, not the wake-ups beside them."""

from __future__ import annotations

import queue

from headrace.runtime.output import WAKE_UPS, batches_queued


def test_wake_ups_are_not_counted_as_batches() -> None:
    out: queue.Queue = queue.Queue()
    assert batches_queued(out) == 0
    for item in [("feed", None, None), ("batch", [1], [0]), ("start", None, None),
                 ("future", None, [1]), ("raise", ValueError("x"), None), ("feed", None, None),
                 ("deferred", None, [2]), ("end", None, None)]:
        out.put(item)
    assert out.qsize() == 8 and batches_queued(out) == 5
    assert set(WAKE_UPS) == {"feed", "start"}
    while not out.empty():  # taking the wake-ups leaves the batches' count as it was
        item = out.get_nowait()
        if item[0] in WAKE_UPS:
            continue
        break
    assert batches_queued(out) == 4
