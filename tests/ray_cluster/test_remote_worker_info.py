"""What remote workers look like to ``explain()`` and to the user: a resource no node has,
workers Ray never placed; on the session's Ray cluster."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

import headrace as hr
from tests.helpers import ArraySource, jitter

pytestmark = pytest.mark.ray

N = 48


def pipeline(n: int = N) -> hr.Pipeline:
    return hr.Pipeline(ArraySource(n), [hr.step(jitter, name="jitter", random=True)])


MISSPELT = {"cpu_nodes": 1}
"""The session's nodes have ``cpu_node``."""


def test_a_resource_no_node_has_is_an_error_naming_it(ray_cluster, no_actor_leaks):
    # it ran every sample locally, and explain() said "2 remote worker(s) now"
    loader = hr.DataLoader(pipeline(), batch_size=4, num_workers=1, options=hr.Options(
        remote=hr.Remote(max_workers=2, resources=MISSPELT)))
    for _ in range(2):  # at each epoch: never silently local after the first
        with pytest.raises(hr.RemoteUnavailableError,
                           match=r"'cpu_nodes', which no node has \(did you mean 'cpu_node'\?\)"
                                 r".*live nodes have in all: CPU \d+, cpu_node \d+"):
            iter(loader)
    loader.close()


def test_a_resource_no_node_has_warns_once_when_not_required(ray_cluster, no_actor_leaks,
                                                              caplog):
    loader = hr.DataLoader(pipeline(), batch_size=4, num_workers=1, options=hr.Options(
        remote=hr.Remote(max_workers=2, resources=MISSPELT, required=False)))
    with caplog.at_level(logging.WARNING, logger="headrace"):
        for _ in range(2):
            assert Counter(int(i) for b in loader for i in b["i"]) == Counter(range(N))
    named = [r for r in caplog.records if "'cpu_nodes'" in r.getMessage()]
    assert len(named) == 1, caplog.text
    assert "local workers only" in named[0].getMessage()
    text = loader.explain()
    assert "remote: not used (" in text and "'cpu_nodes'" in text
    loader.close()


def test_explain_counts_only_the_remote_workers_ray_placed(ray_cluster, no_actor_leaks):
    # 150 cpu_node: the cluster has 200 in all, but no node more than 100, so Ray places
    # neither worker; every sample runs locally
    loader = hr.DataLoader(pipeline(), batch_size=4, num_workers=1, options=hr.Options(
        remote=hr.Remote(max_workers=2, resources={"cpu_node": 150})))
    it = iter(loader)
    try:
        next(it)
        assert sum(w.external for w in it.pool.workers.values()) == 2  # started, not placed
        text = loader.explain()
        assert "0 remote worker(s) now" in text, text
        assert "2 started, 0 placed so far" in text
        assert sum(len(b["i"]) for b in it) == N - 4
        assert loader.remote.remote_samples == 0
        text = loader.explain()  # between epochs: what the next one starts with
        assert "0 remote worker(s) now" in text, text
        assert "2 asked for, none placed yet" in text
    finally:
        del it
        loader.close()
