"""The sample cache in a running loader: hits identical to misses, budgets, clean shutdown."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.cache import codec
from headrace.cache.tiers import sample_key
from tests.helpers import IndexDataset

pytestmark = pytest.mark.integration
N = 48


class Raw:
    """Encoded form: bytes whose content depends on the index."""

    def __len__(self) -> int:
        return N

    def load(self, i: int) -> bytes:
        time.sleep(0.002)  # simulates a storage read (a lookup must cost less, see decode)
        return np.arange(i, i + 64, dtype=np.uint8).tobytes()


def decode(b: bytes) -> np.ndarray:
    """(9, 8) floats: the 64 bytes, then a row holding the index (the first byte).

    Sleeps 8 ms to simulate a real decode: a lookup must cost less than the work it saves, or
    the cache stops looking the form up (``CacheStats.not_worth``)."""
    time.sleep(0.008)
    raw = np.frombuffer(b, np.uint8).astype(np.float32)
    return np.concatenate([raw.reshape(8, 8), np.full((1, 8), raw[0], np.float32)])


def scale(x: np.ndarray) -> np.ndarray:
    x[:8] *= 0.5  # writes into its input: a cached value must not be corrupted by it
    return x


def jitter(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    x[:8] += rng.random((8, 8)).astype(np.float32)  # in place too
    return x


def to_tensor(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x)


def pipeline() -> hr.Pipeline:
    return hr.Pipeline(Raw(), [hr.step(decode, kind="decode"), hr.step(scale),
                               hr.step(jitter, random=True), hr.step(to_tensor)])


def samples(loader) -> dict[int, torch.Tensor]:
    """One epoch by sample index (row 8 holds it); each index exactly once."""
    out = {}
    for batch in loader:
        for row in batch:
            i = int(row[8, 0])
            assert i not in out
            out[i] = row.clone()
    assert sorted(out) == list(range(N))
    return out


def run(cache, num_workers, epochs=3, executor="processes"):
    opts = hr.Options(seed=7, cache=cache, executor=executor)
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=num_workers, options=opts)
    try:
        got = [samples(loader) for _ in range(epochs)]
        return got, [e.cache for e in loader.stats().epochs], loader.explain()
    finally:
        loader.close()


def _equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # element for element


@pytest.mark.parametrize("tier", ["encoded", "decoded"])
@pytest.mark.parametrize("workers,executor", [(0, "processes"), (2, "processes"), (2, "threads")])
def test_a_hit_is_identical_to_a_miss(no_leaks, tier, workers, executor) -> None:
    ref, _, _ = run(None, workers, executor=executor)
    got, stats, text = run(hr.Cache(budget_bytes=1 << 20, split={tier: 1.0}), workers,
                           executor=executor)
    for e in range(3):
        _equal(got[e], ref[e])
    assert stats[0].hits == 0 and stats[0].inserts == N and stats[0].lookups == N
    for s in stats[1:]:
        assert s.hits == s.lookups == N and s.hits_by_tier[tier] == N
    assert f"{tier} 100%" in text


def test_an_augmented_hit_is_identical_for_the_same_seed_and_epoch(no_leaks) -> None:
    opts = hr.Options(seed=3, cache=hr.Cache(budget_bytes=1 << 20, split={"augmented": 1.0}))
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=2, options=opts)
    start = loader.state_dict()
    first = samples(loader)
    second = samples(loader)  # another epoch: its augmented forms are other ones
    assert loader.stats().epochs[1].cache.hits == 0
    loader.load_state_dict(start)  # epoch 0 again, same base seed
    again = samples(loader)
    _equal(again, first)
    assert any(not torch.equal(first[k], second[k]) for k in first)
    c = loader.stats().last.cache
    assert c.hits_by_tier["augmented"] == c.lookups == N
    loader.close()


def test_shared_augmented_serves_another_epochs_sample_once(no_leaks) -> None:
    cache = hr.Cache(budget_bytes=1 << 20, shared_augmented=True, split={"augmented": 1.0})
    got, stats, text = run(cache, 2, epochs=3)
    assert stats[0].hits == 0 and stats[0].inserts == N
    assert stats[1].hits_by_tier["augmented"] == N  # served once...
    _equal(got[1], got[0])  # ...with epoch 0's content: Seneca's trade
    assert stats[2].hits == 0  # ...then gone
    assert "depends on what that epoch or job drew" in text


def test_a_sharded_cache_fills_every_shard_and_serves_what_it_holds(no_leaks,
                                                                      monkeypatch) -> None:
    """A cache split into LMDB shards (``memory_backend``: one per 4 cores, so set to 3 here on
    a smaller machine) with room for half the samples: two workers fill every shard's share in
    epoch 1 (a full shard does not stop them storing into the others), and later epochs hit
    exactly what was stored, identical to a miss."""
    from headrace.cache import memory_backend

    monkeypatch.setattr(memory_backend, "shard_count", lambda _budget, _cpus: 3)
    entry = len(codec.encode(np.zeros((9, 8), np.float32))) + 24 + 16
    budget = 24 * entry  # eight a shard
    ref, _, _ = run(None, 2)
    # no hand-off: on a loaded machine (make test beside helpers) a later epoch once counted
    # N + 1 lookups; the shards, not the slow lane, are what this checks
    opts = hr.Options(seed=7, handoff=False,
                      cache=hr.Cache(budget_bytes=budget, split={"decoded": 1.0}))
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=2, options=opts)
    try:
        got = [samples(loader) for _ in range(3)]
        backend = loader.cache.backend
        assert len(backend.shards) == 3
        assert [s.usage()["decoded"] for s in backend.shards] == [8 * entry] * 3
        assert backend.scan_bytes() == budget
        assert "LMDB on /dev/shm in 3 shards, shared" in loader.explain()
        stats = [e.cache for e in loader.stats().epochs]
    finally:
        loader.close()
    for e in range(3):
        _equal(got[e], ref[e])
    assert stats[0].inserts == 24 and stats[0].full >= 1
    assert all(s.hits == 24 and s.lookups == N for s in stats[1:])


def test_budget_holds_a_share_and_is_never_exceeded(no_leaks) -> None:
    entry = len(codec.encode(np.zeros((9, 8), np.float32))) + 24 + 16
    budget = 12 * entry
    ref, _, _ = run(None, 2)
    got, stats, _ = run(hr.Cache(budget_bytes=budget, split={"decoded": 1.0}), 2)
    for e in range(3):
        _equal(got[e], ref[e])
    s0, s1 = stats[0], stats[1]
    assert s0.inserts == 12 and s0.full >= 1
    assert s1.hits == 12 and s1.bytes_by_tier["decoded"] <= budget
    assert s1.budget_by_tier["decoded"] == budget


def test_backend_is_measured_within_budget(no_leaks) -> None:
    budget = 30_000
    opts = hr.Options(seed=1, cache=hr.Cache(budget_bytes=budget))
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=2, options=opts)
    for _ in loader:
        pass
    backend = loader.cache.backend
    assert backend.scan_bytes() <= budget  # every entry read back and counted
    assert backend.mapped_bytes() <= budget * 1.15 + 64 * 4096
    loader.close()


def test_a_planted_pickle_is_an_error_not_execution(no_leaks, tmp_path) -> None:
    import pickle

    marker = tmp_path / "executed"

    class Touch:
        def __reduce__(self):
            return (type(marker).touch, (marker,))

    opts = hr.Options(seed=1, cache=hr.Cache(budget_bytes=1 << 20), on_error="raise")
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=0, options=opts)
    samples(loader)
    ns = loader.cache.layout.get("decoded").namespace(0, 0)
    backend = loader.cache.backend
    key = sample_key(ns, 5)
    env, data, _ = backend.shards[backend._shard(key)]._dbs()  # the shard the key goes to
    with env.begin(write=True, db=data) as txn:
        txn.put(key, pickle.dumps(Touch()))
    with pytest.raises(hr.StepError) as e:
        samples(loader)
    assert "raw format" in str(e.value) and e.value.index == 5
    assert not marker.exists()
    loader.close()


def test_default_cache_is_on_for_pipelines_off_for_opaque(no_leaks) -> None:
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=0, options=hr.Options(seed=1))
    samples(loader)
    samples(loader)
    assert loader.stats().last.cache.hits_by_tier["decoded"] == N
    assert "split: decoded 100%" in loader.explain()
    loader.close()
    opaque = hr.DataLoader(IndexDataset(16), batch_size=4, num_workers=0)
    assert sorted(int(v) for b in opaque for v in b) == list(range(16))
    assert opaque.cache is None and opaque.stats().last.cache is None  # none set up
    assert "cache: off: a Dataset (not a Pipeline): only __getitem__'s output could be " \
           "cached" in opaque.explain()
    opaque.close()


def test_uncacheable_forms_are_counted_and_skipped(no_leaks) -> None:
    class Thing:
        def __init__(self, v):
            self.v = v

    src = hr.Pipeline(Raw(), [hr.step(Thing, name="wrap"), hr.step(lambda t: t.v, name="unwrap")])
    loader = hr.DataLoader(src, batch_size=8, num_workers=0,
                           options=hr.Options(cache=hr.Cache(budget_bytes=1 << 20)))
    list(loader)
    c = loader.stats().last.cache
    # encoded (bytes) cannot be the decoded form... the final output is bytes again: stored
    assert c.inserts == N and c.uncacheable == 0
    loader.close()


def test_mdp_takes_the_training_loops_rate_as_t_gpu(no_leaks) -> None:
    """A training loop slower than the input pipeline: after an epoch MDP's prediction is
    capped by the loop's own measured rate instead of the input pipeline's bound."""
    opts = hr.Options(seed=3, cache=hr.Cache(budget_bytes=1 << 20))
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=0, options=opts)
    for _ in range(3):
        for _batch in loader:
            time.sleep(0.05)  # simulates a training step: 160 samples/s at most
    s = loader.cache
    e = loader.stats().epochs[-2]  # the epoch the last plan measured
    own = e.samples / (e.wall_s - e.stall_s)
    assert own <= 160.0
    assert s.plan is not None and s.plan_t_gpu == pytest.approx(own, rel=0.05)
    assert s.predicted[-1] <= s.plan_t_gpu * (1 + 1e-9)
    assert "accelerator T_GPU" in loader.explain()
    loader.close()


def test_a_repeated_index_still_reads_the_forms_before_the_first_random_step(no_leaks) -> None:
    # a sampler with replacement: a repeat draws its own augmentation (runtime/draws.py), so its
    # seeded forms are its own, but its decoded form is the first copy's: still looked up
    sampler = torch.utils.data.WeightedRandomSampler(
        torch.ones(N), N, replacement=True, generator=torch.Generator().manual_seed(0))
    loader = hr.DataLoader(pipeline(), batch_size=8, sampler=sampler, num_workers=2,
                           options=hr.Options(seed=7, cache=hr.Cache(), profile_store=False))
    try:
        for _ in range(2):
            assert sum(len(b) for b in loader) == N
        assert loader.stats().last.cache.lookups == N
    finally:
        loader.close()


def test_a_cache_dropped_mid_run_is_dropped_by_persistent_workers_too(monkeypatch, no_leaks):
    """The cache failing as an epoch starts (a full /dev/shm) is dropped, but persistent
    workers kept the client they started with: they served the next epochs from the deleted
    directory, whose shared memory stayed mapped, while explain() said the cache was off."""
    from headrace.cache import session

    real, calls = session.CacheSession.replan, []

    def fails_second(self, *a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, *a, **kw)

    monkeypatch.setattr(session.CacheSession, "replan", fails_second)
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=2, persistent_workers=True,
                           timeout=60, options=hr.Options(cache=hr.Cache(budget_bytes=1 << 20),
                                                          profile_store=False))
    try:
        assert sorted(samples(loader)) == list(range(N))
        path = loader.cache.backend.path
        first = {w.process.pid for w in loader._pool.workers.values()}
        assert sorted(samples(loader)) == list(range(N))  # the cache failed: dropped
        assert loader.cache is None and "cache: off: it failed (OSError" in loader.explain()
        assert not {w.process.pid for w in loader._pool.workers.values()} & first  # new ones
        for w in loader._pool.workers.values():
            with open(f"/proc/{w.process.pid}/maps") as f:
                assert path not in f.read()
        epochs = loader.stats().epochs
        assert epochs[0].cache is not None and epochs[0].cache.inserts == N  # kept
        assert epochs[1].cache is None
    finally:
        loader.close()


def _torch_flip(x: np.ndarray) -> np.ndarray:  # as torchvision's RandomHorizontalFlip draws
    return x[:, ::-1].copy() if float(torch.rand(1)) < 0.5 else x


def _numpy_noise(x: np.ndarray) -> np.ndarray:
    return x + np.random.random((9, 8)).astype(np.float32)


def _python_shift(x: np.ndarray) -> np.ndarray:
    import random

    return x + random.random() if int(x[8, 0]) % 3 == 0 else x  # on some samples only


@pytest.mark.parametrize("draws", [_torch_flip, _numpy_noise, _python_shift])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_step_drawing_from_a_global_generator_is_never_frozen_by_the_cache(
        no_leaks, draws, workers) -> None:
    # not declared random=True: its output was cached as the deterministic decoded form in
    # the first epoch and served in every later one (the same "augmentation" each epoch)
    def run(cache):
        pipe = hr.Pipeline(Raw(), [hr.step(decode, kind="decode"), hr.step(draws),
                                   hr.step(to_tensor)])
        loader = hr.DataLoader(pipe, batch_size=8, num_workers=workers,
                               options=hr.Options(seed=3, cache=cache))
        try:
            return [samples(loader) for _ in range(3)], loader.stats(), loader.explain()
        finally:
            loader.close()

    ref, _, _ = run(None)
    got, stats, text = run(hr.Cache(budget_bytes=1 << 20))
    for e in range(3):
        _equal(got[e], ref[e])
    assert any(not torch.equal(got[0][i], got[1][i]) for i in got[0])  # epochs differ
    first = stats.epochs[0].cache
    assert first.drew > 0 and first.inserts + first.drew == N  # only the encoded form stored
    assert "drew from a global random generator" in text


def test_a_hit_resumed_in_process_is_profiled_with_its_input_size(no_leaks, monkeypatch) -> None:
    # num_workers=0 profiled a run resumed from a cached form as starting from 0 bytes: the
    # next step looked inflating, and AutoOrder moved steps on that number
    from headrace.runtime.monitor import Monitor

    seen: list[tuple[int, int]] = []
    own = Monitor.on_sample

    def spy(self, index, step_s, slow, timings, bytes_in=0):
        seen.append((timings[0].step if timings else -1, bytes_in))
        return own(self, index, step_s, slow, timings, bytes_in)

    monkeypatch.setattr(Monitor, "on_sample", spy)
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=0, options=hr.Options(seed=1))
    try:
        samples(loader)
        samples(loader)  # every sample resumes after its cached decoded form, but the hits
        checked = loader.cache.counters.totals()["checked"]  # computed again (cache/verify.py)
    finally:
        loader.close()
    resumed = [b for step, b in seen if step > 0]
    assert checked == 2  # CHECKS_UNVERIFIED, in the one worker slot
    assert len(resumed) == N - checked and all(b == 9 * 8 * 4 for b in resumed)  # (9, 8) floats


class Small:
    """Four samples: fewer than a tier needs measured (``MIN_MEASURED``) before the cache may
    judge a form not worth storing or looking up, so every form is stored and looked up."""

    def __len__(self) -> int:
        return 4

    def load(self, i: int) -> int:
        return i


def laid_out(i: int) -> dict:
    """A deterministic step whose outputs are not in C order."""
    base = np.arange(6 * 5, dtype=np.float32).reshape(6, 5) + i
    t = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(1, 2, 3, 4) + i
    return {"i": i, "fortran": np.asfortranarray(base), "crop": base[1:4, 1:3],
            "channels_last": t.contiguous(memory_format=torch.channels_last)}


def keep(batch: list) -> list:
    return batch


def test_a_hit_has_the_memory_layout_of_a_computed_sample(no_leaks) -> None:
    # a Fortran-ordered array used to come back C-ordered from the cache: same values, other
    # strides and flags than the first epoch computed
    loader = hr.DataLoader(hr.Pipeline(Small(), [hr.step(laid_out)]), batch_size=2,
                           collate_fn=keep, num_workers=0,
                           options=hr.Options(seed=1, cache=hr.Cache(budget_bytes=1 << 20)))
    try:
        epochs = [{s["i"]: s for batch in loader for s in batch} for _ in range(2)]
        computed, hit = epochs
        assert [e.cache.hits for e in loader.stats().epochs] == [0, 4]
    finally:
        loader.close()
    for i in range(4):
        for k in ("fortran", "crop"):
            np.testing.assert_array_equal(hit[i][k], computed[i][k])
            assert hit[i][k].strides == computed[i][k].strides
        assert hit[i]["fortran"].flags.f_contiguous
        assert torch.equal(hit[i]["channels_last"], computed[i]["channels_last"])
        assert hit[i]["channels_last"].stride() == computed[i]["channels_last"].stride()


def test_a_budget_of_zero_is_explained_as_caching_nothing(no_leaks) -> None:
    # planned, then explained, as "decoded 100%" (the default split, then MDP's tie-break)
    loader = hr.DataLoader(pipeline(), batch_size=8, num_workers=0,
                           options=hr.Options(seed=1, cache=hr.Cache(budget_bytes=0)))
    try:
        for _ in range(2):  # the second epoch with a profile: MDP would plan it
            samples(loader)
        text = loader.explain()
        assert "split: nothing (no budget: nothing is cached" in text
        assert "decoded 100%" not in text
        assert loader.stats().last.cache.hits == 0
    finally:
        loader.close()


def test_explain_over_a_dataset_does_not_advise_shared_augmented_when_it_is_set(no_leaks) -> None:
    # it said "Cache(shared_augmented=True) reuses it across epochs" with the option set, the
    # next line saying that it was
    told = {}
    for shared in (False, True):
        loader = hr.DataLoader(IndexDataset(16), batch_size=4, options=hr.Options(
            cache=hr.Cache(budget_bytes=1 << 20, shared_augmented=shared)))
        for _ in range(2):
            list(loader)
        told[shared] = loader.explain()
        loader.close()
    assert "only __getitem__'s output can be cached" in told[True]
    assert "Cache(shared_augmented=True) reuses it" in told[False]
    assert "Cache(shared_augmented=True) reuses it" not in told[True]
