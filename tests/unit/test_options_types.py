"""Options, Cache and TimeoutConfig values of the wrong type are refused when they are built,
in a ``TypeError`` naming the field (``runtime/options.py``'s ``_check_types``); they used to
be accepted and fail later in words that named no field (an ``AttributeError`` in
``DataLoader()``, a worker blamed on ``worker_init_fn``, a truthy ``"no"`` meaning on). No
worker process: every loader here runs in the training process or is never iterated."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headrace as hr


def test_a_number_of_seconds_for_timeout_names_timeout_config():
    # torch's timeout= is seconds; Options(timeout=5) failed in DataLoader() with
    # "'int' object has no attribute 'window'"
    with pytest.raises(TypeError, match=r"timeout=.*TimeoutConfig.*seconds"):
        hr.Options(timeout=5)


@pytest.mark.parametrize("cache", [True, "mem", 123])
def test_cache_takes_a_cache_or_none(cache):
    with pytest.raises(TypeError, match=r"cache=.*hr\.Cache|cache=.*headrace\.Cache"):
        hr.Options(cache=cache)


def test_profile_store_none_stays_off():
    # None worked as "no store" (falsy): the type check keeps it so, as False
    assert hr.Options(profile_store=None).profile_store is False


def test_cache_false_is_off():
    # the obvious spelling of "off" failed in DataLoader() ('bool' object has no attribute 'url')
    opts = hr.Options(cache=False)
    assert opts.cache is None
    loader = hr.DataLoader(list(range(4)), batch_size=2, options=opts)
    assert loader.cache is None and torch.cat(list(loader)).tolist() == [0, 1, 2, 3]


def test_a_cache_url_that_is_not_a_string_names_url():
    with pytest.raises(TypeError, match="url"):
        hr.Cache(url=5)


@pytest.mark.parametrize("options", [{"seed": 1}, {}, hr.Options, 123])
def test_options_takes_an_options_instance(options):
    # a dict or the class failed with AttributeError; {} was silently replaced by the defaults
    with pytest.raises(TypeError, match="options= takes a headrace.Options"):
        hr.DataLoader(list(range(4)), options=options)


@pytest.mark.parametrize("field, value", [
    ("worker_blas_threads", 2.5), ("collate_threads", 2.0), ("max_in_flight", 2.5),
    ("max_worker_restarts", 1.5), ("collate_threads", True), ("max_in_flight", "4"),
])
def test_integer_fields_refuse_other_numbers(field, value):
    with pytest.raises(TypeError, match=rf"{field}=.*takes an int"):
        hr.Options(**{field: value})


def test_numpy_integers_are_kept_as_ints():
    opts = hr.Options(collate_threads=np.int64(2), seed=np.int64(3))
    assert type(opts.collate_threads) is int and type(opts.seed) is int
    for seed in (-2**63, -1, 2**64 - 1):  # torch's whole seed range stays accepted
        hr.DataLoader(list(range(2)), options=hr.Options(seed=seed))


@pytest.mark.parametrize("seed", ["a", 1.5, True])
def test_seed_is_an_int(seed):
    # torch's manual_seed raised in DataLoader(), naming no field
    with pytest.raises(TypeError, match="seed="):
        hr.Options(seed=seed)


@pytest.mark.parametrize("seed", [2**70, -2**63 - 1, 2**64])
def test_seed_is_within_torchs_range(seed):
    with pytest.raises(ValueError, match="seed must be in"):
        hr.Options(seed=seed)


@pytest.mark.parametrize("autoscale", [True, None])
def test_autoscale_takes_an_autoscale_config(autoscale):
    with pytest.raises(TypeError, match="autoscale=.*AutoscaleConfig"):
        hr.Options(autoscale=autoscale)


@pytest.mark.parametrize("field, value", [
    ("profile_store", 123), ("sample_timeout_s", "5"), ("slow_lane_share", "x"),
    ("profile", "no"), ("handoff", "no"), ("reorder", 2),
])
def test_other_fields_name_themselves(field, value):
    with pytest.raises(TypeError, match=rf"{field}="):
        hr.Options(**{field: value})


@pytest.mark.parametrize("field, value, kept", [
    # values that worked before the type checks keep working (a review): switches as
    # None, NumPy's bools or 0/1 (argparse type=int), numbers of other kinds, a bytes path
    ("reorder", None, False), ("handoff", np.True_, True), ("profile", 0, False),
    ("profile", 1, True), ("slow_lane_share", torch.tensor(0.5), 0.5),
    ("sample_timeout_s", np.float32(2.0), 2.0), ("profile_store", b"/tmp/p.sqlite", "/tmp/p.sqlite"),
])
def test_values_that_worked_before_are_taken(field, value, kept):
    got = getattr(hr.Options(**{field: value}), field)
    assert got == kept and type(got) is type(kept)


@pytest.mark.parametrize("field, value", [("window", "x"), ("percentile", "75"),
                                          ("warmup_samples", 1.5), ("fixed_s", "1")])
def test_timeout_config_fields_name_themselves(field, value):
    with pytest.raises(TypeError, match=rf"TimeoutConfig\({field}="):
        hr.TimeoutConfig(**{field: value})


def test_a_fixed_count_set_on_an_auto_loader_parks_its_scaler():
    # the scaler resized a pool it was told to keep fixed (loader.num_workers = 2 after "auto")
    loader = hr.DataLoader(list(range(8)), batch_size=2, num_workers="auto")
    scaler = loader.monitor.scaler
    assert scaler is not None
    loader.num_workers = 2
    assert loader.monitor.scaler is None and not loader.autoscale
    loader.num_workers = "auto"  # still a loader built with "auto": the scaler comes back
    assert loader.monitor.scaler is scaler and loader.autoscale
