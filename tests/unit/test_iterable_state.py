"""A loader over an IterableDataset (torch's own iterator, ``runtime/iterable_dataset.py``): its
state dict records no position, loading it warns where a part-way epoch starts over, a state of
the other kind is refused; options that cannot act on torch's iterator are refused, tuning
options it ignores are named in a warning, and
``num_workers="auto"`` names the fixed count it used. In the training process (no workers)."""

from __future__ import annotations

import warnings

import pytest
import torch.utils.data as tud

import headrace as hr
from headrace.runtime.loader_arguments import unused_by_iterable


class Stream(tud.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def batches(it):
    return [b.tolist() for b in it]


def test_a_part_way_state_round_trips_and_the_resumed_epoch_starts_over_as_torch():
    loader = hr.DataLoader(Stream(), batch_size=4)
    assert loader.state_dict()["epochs_started"] == 0
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert state["epochs_started"] == 1 and state["batches_delivered"] == 1
    resumed = hr.DataLoader(Stream(), batch_size=4)
    with pytest.warns(hr.IterablePositionWarning, match="1 batch.*cannot be restored"):
        resumed.load_state_dict(state)
    # as a resumed run with torch's loader, which saves nothing: the epoch from its start
    assert batches(resumed) == batches(tud.DataLoader(Stream(), batch_size=4))
    assert resumed.state_dict()["epochs_started"] == 2


def test_a_state_saved_after_the_epochs_end_loads_without_a_warning():
    loader = hr.DataLoader(Stream(), batch_size=4)
    it = iter(loader)
    assert len(batches(it)) == 3
    state = loader.state_dict()
    assert state["batches_delivered"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hr.DataLoader(Stream(), batch_size=4).load_state_dict(state)


def test_a_state_of_the_other_kind_is_refused_with_its_reason():
    iterable = hr.DataLoader(Stream(), batch_size=4)
    mapped = hr.DataLoader(list(range(10)), batch_size=4)
    with pytest.raises(hr.StateDictError, match="not an IterableDataset loader's"):
        iterable.load_state_dict(mapped.state_dict())
    with pytest.raises(hr.StateDictError, match="saved by a loader over an IterableDataset"):
        mapped.load_state_dict(iterable.state_dict())


@pytest.mark.parametrize("options, named", [
    (hr.Options(on_error="skip"), "on_error='skip'"),
    (hr.Options(sample_timeout_s=1.0), "sample_timeout_s"),
])
def test_options_that_cannot_act_on_torchs_iterator_are_refused(options, named):
    with pytest.raises(ValueError, match=f"Options\\({named}.*needs a map-style dataset"):
        hr.DataLoader(Stream(), batch_size=4, options=options)


def test_auto_workers_become_a_fixed_count_named_in_a_warning():
    with pytest.warns(UserWarning, match=r"num_workers='auto' over an IterableDataset.*"
                                         r"using num_workers=(\d+)") as caught:
        loader = hr.DataLoader(Stream(), batch_size=4, num_workers="auto",
                               options=hr.Options(autoscale=hr.AutoscaleConfig(initial=2)))
    assert any("using num_workers=2," in str(w.message) for w in caught)
    assert type(loader.num_workers) is int and loader.num_workers == 2
    assert not loader.autoscale  # nothing scales torch's iterator


def test_tuning_options_set_for_samples_are_named_in_a_warning_not_ignored_silently():
    options = hr.Options(max_in_flight=64, collate_threads=2, cache=hr.Cache(budget_bytes=2**30),
                         reorder=False)
    with pytest.warns(UserWarning, match=r"Options\(max_in_flight, collate_threads, cache\): "
                                         r"no effect over an IterableDataset") as caught:
        loader = hr.DataLoader(Stream(), batch_size=4, options=options)
    assert len(caught) == 1
    assert batches(loader) == batches(tud.DataLoader(Stream(), batch_size=4))


@pytest.mark.parametrize("options", [
    hr.Options(),
    # switches that turn off what an IterableDataset never gets, and torch's own BLAS threads
    hr.Options(cache=None, reorder=False, profile=False, handoff=False, profile_store=False,
               worker_blas_threads=None, autoscale=hr.AutoscaleConfig(initial=2)),
])
def test_defaults_and_switches_turned_off_warn_nothing(options):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hr.DataLoader(Stream(), batch_size=4, options=options)
    assert unused_by_iterable(options) == []


@pytest.mark.parametrize("then", [True, False])
def test_another_persistent_workers_warns_as_a_map_style_resume_does(then):
    # torch draws the workers' base seed once when they persist, at every epoch otherwise: the
    # epochs after a resume with the other setting had other seeds, silently (no worker starts
    # here: state_dict() and load_state_dict() before any iter())
    saved = hr.DataLoader(Stream(), batch_size=4, num_workers=1, persistent_workers=then)
    state = saved.state_dict()
    assert state["persistent_workers"] is then
    other = hr.DataLoader(Stream(), batch_size=4, num_workers=1, persistent_workers=not then)
    with pytest.warns(UserWarning, match=f"persistent_workers={then} then, {not then} now"):
        other.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hr.DataLoader(Stream(), batch_size=4, num_workers=1,
                      persistent_workers=then).load_state_dict(state)
        del state["persistent_workers"]  # a state dict saved before the key: nothing to tell
        other.load_state_dict(state)
