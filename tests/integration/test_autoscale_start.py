"""``num_workers="auto"`` with a stored profile: the first epoch starts at the workers that keep
the cores busy (``AutoscaleConfig.start_count``), within the memory budget."""

import pytest

import headrace as hr
from headrace.planner.workers import AutoscaleConfig
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration


def first_pool_size(store, **autoscale) -> int:
    """Workers the first epoch's pool started with (a loader with a profile in ``store``)."""
    opts = hr.Options(cache=None, profile_store=store,
                      autoscale=AutoscaleConfig(max_workers=6, **autoscale))
    loader = hr.DataLoader(IndexDataset(48, slow_every=1, slow_s=0.01), batch_size=4,
                           num_workers="auto", options=opts)
    try:
        assert sorted(i for b in loader for i in b.tolist()) == list(range(48))
        return loader.monitor.workers_timeline[0][1]
    finally:
        loader.close()


def test_a_stored_profile_starts_the_first_epoch_where_the_cores_stay_busy(tmp_path):
    store = tmp_path / "profiles.sqlite"
    cold = first_pool_size(store)  # no profile yet: the cores (at most 2 on CI machines)
    assert cold == AutoscaleConfig().start_count()
    # samples sleep 10 ms and use little CPU: cores / CPU share is far above the bound of 6
    assert first_pool_size(store) == 6
    # a memory budget smaller than the training process: no more than the cold start
    assert first_pool_size(store, memory_budget_bytes=1) == cold
