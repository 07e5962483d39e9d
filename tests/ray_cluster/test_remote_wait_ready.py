"""``RemoteSession.wait_ready`` (the benchmarks keep remote start-up out of the timed epoch):
it returns once the workers are placed, woken by the placement, and does not poll: it
checked every 50 ms, about 20 checks in a second of waiting."""

from __future__ import annotations

import pytest

import headrace as hr
from tests.helpers import ident_collate
from tests.ray_cluster.test_remote import ON_CPU_NODES, pipeline

pytestmark = pytest.mark.ray


@pytest.mark.timeout(120)
def test_wait_ready_is_woken_by_placements_and_does_not_poll(ray_cluster, no_actor_leaks):
    loader = hr.DataLoader(pipeline(400), batch_size=4, num_workers=1, collate_fn=ident_collate,
                           options=hr.Options(remote=hr.Remote(max_workers=2,
                                                               resources=ON_CPU_NODES)))
    session = loader.remote
    try:
        it = iter(loader)
        assert session.wait_ready(2, timeout_s=60)
        assert session.ready_workers() == 2
        checks = []
        real = session.ready_workers

        def counted() -> int:
            checks.append(1)
            return real()

        session.ready_workers = counted  # counts the checks of one wait (Ray untouched)
        assert not session.wait_ready(3, timeout_s=1.0)  # 2 slots: a third never comes
        # one check at the start and one at the timeout (a wake-up or two from the
        # proxies, at most); polling made about 20
        assert len(checks) <= 4, len(checks)
        del it
    finally:
        loader.close()
