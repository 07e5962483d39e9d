"""What the cache keeps over long runs (a hunt for memory and text that grow per epoch or per
loader): explain()'s MDP lines, the LMDB write locks of caches closed for good."""

import dataclasses

from headrace.cache import lmdb_envs
from headrace.cache.lmdb_store import LmdbStore
from headrace.cache.session_explain import PREDICTIONS_SHOWN, _prediction_lines
from headrace.telemetry.stats import EpochStats

EPOCH = EpochStats(epoch=0, wall_s=2.0, stall_s=0.5, batches=10, samples=100,
                   samples_per_s=50.0, fast_samples=100, slow_samples=0, skipped_samples=0,
                   retried_samples=0, main_cpu_per_batch_ms=1.0, finished=True)


def test_explain_lists_the_latest_mdp_predictions_and_sums_up_the_rest():
    # a 300-epoch job's plan printed 300 "epoch k: measured ..., MDP predicted ..." lines
    epochs = [dataclasses.replace(EPOCH, epoch=k, samples_per_s=40.0 + k) for k in range(300)]
    lines = _prediction_lines(epochs, [50.0] * 300)
    assert len(lines) == PREDICTIONS_SHOWN + 1
    assert lines[0] == "  epochs 0-296: measured ÷ MDP predicted 3.76 median (0.80-6.72)"
    assert lines[-1] == "  epoch 299: measured 339 samples/s, MDP predicted 50"
    assert _prediction_lines(epochs[:2], [50.0, None]) == [
        "  epoch 0: measured 40 samples/s, MDP predicted 50"]


def test_a_cache_closed_for_good_leaves_no_write_lock(tmp_path):
    # one per loader stayed for the process's life: 300 loaders, 300 locks of dead paths
    path = str(tmp_path / "shard-0")
    store = LmdbStore(path, 1 << 20)
    store.set_budgets({"decoded": 1 << 19})
    assert store.put(b"k" * 16, "decoded", b"v" * 100, []) == "stored"
    assert path in lmdb_envs._write_locks
    lmdb_envs.close_envs(str(tmp_path))
    assert path not in lmdb_envs._write_locks
