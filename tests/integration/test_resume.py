"""Invariant 3: exact resume. One contract, run against the loader in every mode.

For each snapshot point (before the first batch, after one, mid-epoch, at the last batch,
between epochs) the state dict goes through JSON into a new loader, possibly with another worker
count, and the rest of the run is compared sample by sample with an uninterrupted run.
"""

import fcntl
import json
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import headrace as hr
from tests.helpers import ArraySource, noise, wait_at_gate

pytestmark = pytest.mark.integration

N, EPOCHS = 26, 2


def make(**kw):
    pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)])
    return hr.DataLoader(pipe, **kw)


def rows(batch):
    """(index, content) pairs of a batch; content carries the per-sample random draw."""
    flat = batch.reshape(len(batch), -1)[:, 0].tolist()
    return [(int(np.floor(v)), round(v, 6)) for v in flat]


def run(loader, epochs, stop_after=None):
    """Batches per epoch; stop after ``stop_after`` batches of the first epoch (returns early)."""
    out = []
    for e in range(epochs):
        got = []
        it = iter(loader)
        for b in it:
            got.append(rows(b))
            if e == 0 and stop_after is not None and len(got) == stop_after:
                out.append(got)
                return out, it
        out.append(got)
    return out, None


MODES = [
    {"in_order": True, "num_workers": 0, "batch_size": 4, "shuffle": True},
    {"in_order": True, "num_workers": 2, "batch_size": 4, "shuffle": True, "drop_last": True},
    {"in_order": False, "num_workers": 2, "batch_size": 4, "shuffle": True},
    {"in_order": False, "num_workers": 3, "batch_size": 5, "shuffle": False, "drop_last": True},
    {"in_order": False, "num_workers": 2, "batch_size": None, "shuffle": True},
    # the first epoch of persistent workers draws the base seed, later ones do not: a resume
    # replayed it without drawing (the seed came back in the state dict): other samples
    {"in_order": True, "num_workers": 3, "batch_size": 4, "shuffle": True,
     "persistent_workers": True},
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()))
@pytest.mark.parametrize("point", ["start", "one", "middle", "last", "between"])
def test_resume_delivers_exactly_the_rest_with_identical_content(mode, point, no_leaks):
    kw = dict(mode, generator=torch.Generator().manual_seed(5))
    full, _ = run(make(**kw), EPOCHS)
    n_batches = len(full[0])
    stop = {"start": 0, "one": 1, "middle": n_batches // 2, "last": n_batches, "between": None}[point]

    first = make(**dict(mode, generator=torch.Generator().manual_seed(5)))
    if point == "between":
        before, _ = run(first, 1)
        it = None
    elif stop == 0:
        it = iter(first)
        before = [[]]
    else:
        before, it = run(first, 1, stop_after=stop)
    state = json.loads(json.dumps(first.state_dict()))
    del it, first

    other_workers = {0: 2, 2: 0, 3: 1}[mode["num_workers"]]  # resume with another worker count
    second = make(**dict(mode, num_workers=other_workers, generator=torch.Generator().manual_seed(99)))
    second.load_state_dict(state)
    # "last": every batch taken and the end not seen yet (Lightning knows len(loader) and asks
    # no further): that epoch is done, and the next iter() is the next epoch, as after
    # "between" (it was an empty epoch: a run resumed there lost a whole epoch of steps)
    done = point in ("between", "last")
    after, _ = run(second, EPOCHS - 1 if done else EPOCHS)

    epoch0_before = [r for b in before[0] for r in b]
    if done:
        resumed_epoch0, later = [], after
        assert len(after) == 1 and len(after[0]) == n_batches
    else:
        resumed_epoch0, later = [r for b in after[0] for r in b], after[1:]
    full0 = [r for b in full[0] for r in b]
    # exactly once, identical content (index and random draw) for the interrupted epoch
    assert Counter(epoch0_before + resumed_epoch0) == Counter(full0)
    assert not set(epoch0_before) & set(resumed_epoch0)
    if mode["in_order"]:
        assert epoch0_before + resumed_epoch0 == full0  # and in torch's order
    elif mode["batch_size"] and not done:  # regrouped: full batches but the last,
        # also resumed with no workers (each sampler batch then has holes to fill across)
        assert all(len(b) == mode["batch_size"] for b in after[0][:-1])
    # the following epoch is identical too (the generator's state travelled in the state dict)
    for got, ref in zip(later, full[1:], strict=True):
        flat_got, flat_ref = [r for b in got for r in b], [r for b in ref for r in b]
        assert Counter(flat_got) == Counter(flat_ref)
        if mode["in_order"]:
            assert got == ref


def test_state_dict_is_small_versioned_and_checked():
    loader = make(batch_size=4, num_workers=0)
    it = iter(loader)
    next(it)
    sd = loader.state_dict()
    assert sd["schema_version"] == 2 and sd["in_epoch"] and sd["delivered_count"] == 4
    assert len(json.dumps(sd)) < 20_000
    with pytest.raises(hr.StateDictError, match=f"dataset of {N} samples"):
        hr.DataLoader(hr.Pipeline(ArraySource(N + 1), [hr.step(noise, random=True)]),
                      batch_size=4).load_state_dict(sd)
    with pytest.raises(hr.StateDictError, match=f"epoch of {N} samples.*have {N - 2}"):
        make(batch_size=4, drop_last=True).load_state_dict(sd)  # 2 of the 26 left out
    old = {k: v for k, v in sd.items() if k != "epoch_samples"}  # saved by an older headrace
    with pytest.raises(hr.StateDictError, match="batches per epoch"):
        make(batch_size=3).load_state_dict(old)
    with pytest.raises(hr.StateDictError, match="schema_version"):
        make(batch_size=4).load_state_dict({**sd, "schema_version": 99})


def test_resume_in_a_fresh_process_with_the_global_rng(tmp_path, no_leaks):
    torch.manual_seed(11)
    full, _ = run(make(batch_size=4, shuffle=True, num_workers=2), 1)
    torch.manual_seed(11)
    first = make(batch_size=4, shuffle=True, num_workers=2)
    before, it = run(first, 1, stop_after=3)
    (tmp_path / "state.json").write_text(json.dumps(first.state_dict()))
    del it, first
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        import torch
        from tests.integration.test_resume import make, rows
        torch.manual_seed(12345)  # whatever the new process's global RNG is
        loader = make(batch_size=4, shuffle=True, num_workers=1)
        loader.load_state_dict(json.loads(open({str(tmp_path / "state.json")!r}).read()))
        print(json.dumps([r for b in loader for r in rows(b)]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    resumed = [tuple(r) for r in json.loads(out.stdout)]
    done = [r for b in before[0] for r in b]
    assert Counter(done + resumed) == Counter(r for b in full[0] for r in b)


@pytest.mark.parametrize("in_order", [False, True])
def test_resume_with_a_distributed_sampler(in_order, no_leaks):
    from torch.utils.data.distributed import DistributedSampler

    def loader():
        pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)])
        sampler = DistributedSampler(pipe, num_replicas=2, rank=1, shuffle=True, seed=3)
        sampler.set_epoch(4)  # the training script's job, before iter(), as with torch
        return hr.DataLoader(pipe, batch_size=3, sampler=sampler, num_workers=2, in_order=in_order)

    torch.manual_seed(7)  # the base seed of per-sample randomness comes from torch's RNG here
    full = [r for b in loader() for r in rows(b)]
    first = loader()
    torch.manual_seed(7)
    it = iter(first)
    before = [r for _ in range(2) for r in rows(next(it))]
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    second = loader()
    second.load_state_dict(state)
    after = [r for b in second for r in rows(b)]
    assert Counter(before + after) == Counter(full)
    if in_order:
        assert before + after == full


def skipping_rank(batch_size: int, workers: int):
    """Rank 0 of 2 (a ``DistributedSampler`` without a process group) with
    ``on_error="skip"``: its epochs are padded to the batch count every rank takes."""
    from torch.utils.data.distributed import DistributedSampler

    pipe = hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)])
    sampler = DistributedSampler(pipe, num_replicas=2, rank=0, shuffle=True, seed=3)
    return hr.DataLoader(pipe, batch_size=batch_size, sampler=sampler, num_workers=workers,
                         options=hr.Options(seed=5, on_error="skip"))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_rank_with_skip_takes_only_the_batches_it_had_left(workers, no_leaks):
    # DDP with on_error="skip" pads a rank's epoch to the batch count every rank takes; a
    # resumed epoch counted only its own batches, so it repeated its last batch as often as
    # batches came before the resume (3 extra copies after 3), with a warning blaming skips
    full = [r for b in skipping_rank(3, workers) for r in rows(b)]
    first = skipping_rank(3, workers)
    assert len(first) == 5  # 13 of the 26 samples, in batches of 3
    it = iter(first)
    before = [rows(next(it)) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    second = skipping_rank(3, workers)
    second.load_state_dict(state)
    it = iter(second)
    before.append(rows(next(it)))  # and a resumed epoch's state counts what came before it
    state = json.loads(json.dumps(second.state_dict()))
    del it, second
    third = skipping_rank(3, workers)
    third.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "left this rank short" warning: nothing was
        after = [rows(b) for b in third]
    assert len(before) + len(after) == 5
    assert Counter(r for b in before + after for r in b) == Counter(full)


def test_a_resumed_rank_with_skip_and_another_batch_size_pads_to_its_own_batches(no_leaks):
    # batches_delivered counts batches of the saved run's size: subtracted from len(loader) in
    # another size, the rank repeated its last batch (56 samples, 50 distinct)
    full = [r for b in skipping_rank(3, 0) for r in rows(b)]
    first = skipping_rank(3, 0)
    it = iter(first)
    before = [r for _ in range(2) for r in rows(next(it))]  # 6 of the rank's 13 samples
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    second = skipping_rank(2, 0)
    with pytest.warns(UserWarning, match="batch_size=3 then, 2 now"):
        second.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "left this rank short" warning
        after = [rows(b) for b in second]
    assert len(after) == 4  # the 7 samples left, in batches of 2
    assert Counter(before + [r for b in after for r in b]) == Counter(full)


class Dealt(torch.utils.data.BatchSampler):
    """Every other batch of a batch sampler, kept as ``batch_sampler`` (Accelerate's
    ``BatchSamplerShard`` is built so)."""

    def __init__(self, batch_sampler) -> None:  # no super(): nothing to wrap
        self.batch_sampler = batch_sampler

    def __iter__(self):
        return (b for k, b in enumerate(self.batch_sampler) if k % 2 == 0)

    def __len__(self) -> int:
        return (len(self.batch_sampler) + 1) // 2


def test_a_later_epoch_resumes_the_order_of_a_generator_under_a_wrapped_batch_sampler(no_leaks):
    # the walk to a sampler's own generator followed ``sampler`` only: under a wrapper keeping
    # ``batch_sampler`` its state was not saved, and epoch 1 resumed in another order
    def loader():
        order = torch.utils.data.RandomSampler(range(N), generator=torch.Generator().manual_seed(4))
        batches = Dealt(torch.utils.data.BatchSampler(order, 3, False))
        return hr.DataLoader(hr.Pipeline(ArraySource(N), [hr.step(noise, random=True)]),
                             batch_sampler=batches, in_order=True,
                             options=hr.Options(seed=2))

    full, _ = run(loader(), 2)
    first = loader()
    list(first)  # epoch 0
    it = iter(first)
    before = [rows(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    second = loader()
    second.load_state_dict(state)
    assert before + [rows(b) for b in second] == full[1]


REPEATS = [3, 1, 3, 3, 0, 1, 7, 3, 2, 1, 3, 0]  # a sampler with replacement: 3 comes 5 times


@pytest.mark.parametrize("workers", [0, 2])
def test_an_index_drawn_again_in_an_epoch_gets_new_draws_and_keeps_them_on_resume(workers,
                                                                                   no_leaks):
    # oversampling: each time an index comes again in an epoch its random steps draw anew,
    # as torch's workers do; the n-th time is counted over every position, so a resumed epoch
    # gives each position the draw it had (runtime/draws.py)
    kw = dict(batch_size=2, sampler=REPEATS, num_workers=workers, in_order=True)
    full, _ = run(make(**kw, generator=torch.Generator().manual_seed(5)), 1)
    flat_full = [r for b in full[0] for r in b]
    assert [i for i, _ in flat_full] == REPEATS
    threes = [v for i, v in flat_full if i == 3]
    assert len(set(threes)) == 5  # five copies of sample 3, five draws

    first = make(**kw, generator=torch.Generator().manual_seed(5))
    before, it = run(first, 1, stop_after=3)
    state = json.loads(json.dumps(first.state_dict()))
    del it, first
    second = make(**dict(kw, num_workers=2 - workers))
    second.load_state_dict(state)
    after, _ = run(second, 1)
    assert [r for b in before[0] + after[0] for r in b] == flat_full


@pytest.mark.parametrize("stop_in_epoch", [True, False])
def test_a_sampler_with_its_own_generator_resumes_a_later_epoch_exactly(stop_in_epoch, no_leaks):
    # RandomSampler(generator=g): at a checkpoint in epoch 1 or after it, g had moved past the
    # epoch's order; the resume replayed another order (some samples twice, others never)
    def loader():
        sampler = torch.utils.data.RandomSampler(range(N), generator=torch.Generator().manual_seed(5))
        return make(batch_size=4, sampler=sampler, num_workers=2, in_order=True,
                     generator=torch.Generator().manual_seed(7))  # the base seeds

    reference = loader()
    full, _ = run(reference, 3)
    reference.close()
    first = loader()
    before, it = run(first, 1)  # epoch 0 whole
    got = [rows(b) for b in iter(first)] if not stop_in_epoch else []
    if stop_in_epoch:
        it = iter(first)
        got = [rows(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    first.close()
    second = loader()
    second.load_state_dict(state)
    after, _ = run(second, 2 if stop_in_epoch else 1)
    second.close()
    assert got + (after[0] if stop_in_epoch else []) == full[1]  # in order: the same order
    assert after[-1] == full[2]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_samplers_empty_batches_are_not_delivered_again_after_a_resume(workers, no_leaks):
    # an empty batch has no position for the delivered bitmap: each resume delivered it again,
    # and the epoch had more batches than len(loader)
    batches = [[0, 1, 2], [], [3], [], [4, 5, 6, 7], [], [8, 9]]

    def loader():
        return make(batch_sampler=batches, num_workers=workers, in_order=True,
                    collate_fn=lambda b: [int(x[0]) for x in b])

    first = loader()
    it = iter(first)
    before = [next(it) for _ in range(4)]
    state = json.loads(json.dumps(first.state_dict()))
    del it
    first.close()
    second = loader()
    second.load_state_dict(state)
    after = list(second)
    again = second.state_dict()  # the resumed epoch is whole again: nothing left in it
    second.close()
    assert before + after == batches
    assert not again["in_epoch"]


class HeldFirst(torch.utils.data.Dataset):
    """40 samples; sample 1 waits at a gate the test holds (``wait_at_gate``), so later ones
    overtake it; sample ``fail`` raises."""

    def __init__(self, gate, fail=None):
        self.gate, self.fail = gate, fail

    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i == self.fail:
            raise ValueError(f"bad sample {i}")
        if i == 1:
            wait_at_gate(self.gate)
        return i


def saved_past_a_held_sample(make, gate):
    """(the first 3 batches, the state dict then) of ``make(2)``'s epoch, taken while sample 1
    is held at ``gate``: every sampler batch left has a hole where a delivered sample was."""
    gate.touch()
    with open(gate) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        first = make(2)
        it = iter(first)
        before = [next(it).tolist() for _ in range(3)]
        state = first.state_dict()
    del it
    first.close()
    assert state["delivered_count"] == 12 and 1 not in {i for b in before for i in b}
    return before, state


def test_a_regrouped_epoch_resumed_without_workers_keeps_full_batches(tmp_path, no_leaks):
    # saved with workers, where a held sample was overtaken: every sampler batch left has
    # holes; without workers each became a short batch (more batches than len(loader))
    def loader(workers):
        return hr.DataLoader(HeldFirst(str(tmp_path / "gate")), batch_size=4,
                             num_workers=workers, in_order=False)

    before, state = saved_past_a_held_sample(loader, tmp_path / "gate")
    second = loader(0)
    second.load_state_dict(state)
    after = [b.tolist() for b in second]
    assert sorted(i for b in before + after for i in b) == list(range(40))
    assert [len(b) for b in after] == [4] * 7 and len(before + after) == len(second)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_regrouped_epoch_resumed_without_workers_loses_no_sample_to_a_failing_one(
        on_error, tmp_path, no_leaks):
    # regrouping across sampler batches gathered samples, and a failing one dropped them all
    def loader(workers):
        return hr.DataLoader(HeldFirst(str(tmp_path / "gate"), fail=37), batch_size=4,
                             num_workers=workers, in_order=False, drop_last=True,
                             options=hr.Options(on_error=on_error))

    before, state = saved_past_a_held_sample(loader, tmp_path / "gate")
    second = loader(0)
    second.load_state_dict(state)
    after, it = [], iter(second)
    for _ in range(20):  # bounded: 40 samples in batches of 4, one error
        try:
            after.append(next(it).tolist())
        except hr.StepError:
            continue
        except StopIteration:
            break
    dropped = second.stats().last.dropped_samples
    second.close()
    got = sorted(i for b in before + after for i in b)
    # drop_last: the last regrouped batch the failing sample left short (3 samples) is dropped
    # and counted, as with workers; every other sample comes once
    assert dropped == 3 and len(got) == len(set(got)) == 36
    assert set(got) <= set(range(40)) - {37}


def _fails_at_7(x: np.ndarray) -> np.ndarray:
    if int(x[0]) == 7:
        raise ValueError("sample 7 is bad")
    return x


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("in_order", [True, False])
def test_a_state_after_the_last_batch_is_between_epochs_with_a_sample_skipped(workers, in_order,
                                                                            left):
    """Every batch taken, the end not seen (Lightning's checkpoint at an epoch's last step),
    one sample skipped: the delivered positions alone fall one short of the epoch, and the
    resume was a near-empty epoch (the skipped sample again) where the next epoch belonged.
    ``left``: the loop left the iterator first (closed), as after a ``break``."""
    def loader(seed):
        pipe = hr.Pipeline(ArraySource(N), [_fails_at_7, hr.step(noise, random=True)])
        return hr.DataLoader(pipe, batch_size=4, shuffle=True, num_workers=workers,
                             in_order=in_order, generator=torch.Generator().manual_seed(seed),
                             options=hr.Options(on_error="skip"))

    full, _ = run(loader(5), EPOCHS)
    first = loader(5)
    it = iter(first)
    for _ in range(len(full[0])):  # every batch, without asking past the last
        next(it)
    if left:
        it.close()
    state = json.loads(json.dumps(first.state_dict()))
    assert not state["in_epoch"] and state["epoch"] == 1
    del it
    first.close()
    second = loader(99)
    second.load_state_dict(state)
    after, _ = run(second, 1)
    assert Counter(r for b in after[0] for r in b) == Counter(r for b in full[1] for r in b)
    assert len(after[0]) == len(full[1])


@pytest.mark.parametrize("sampler", ["replacement", "weighted", "subset"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_drawing_from_the_global_rng_resumes_beside_the_loaders_generator(
        sampler, workers, no_leaks):
    # with generator= (or Options(seed=)), only the loader's generator was saved and
    # replayed: a sampler built without one draws its order from torch's global generator,
    # which the training loop moves, and the resumed epoch replayed another order
    def loader():
        s = {"replacement": lambda: torch.utils.data.RandomSampler(range(N), replacement=True),
             "weighted": lambda: torch.utils.data.WeightedRandomSampler([1.0] * N, N),
             "subset": lambda: torch.utils.data.SubsetRandomSampler(range(N))}[sampler]()
        return make(batch_size=4, sampler=s, num_workers=workers, in_order=True,
                    generator=torch.Generator().manual_seed(7))

    torch.manual_seed(0)
    reference = loader()
    full, _ = run(reference, 1)
    reference.close()
    torch.manual_seed(0)
    first = loader()
    before, it = run(first, 1, stop_after=2)
    state = json.loads(json.dumps(first.state_dict()))
    del it
    first.close()
    torch.rand(1000)  # the training loop draws on (a new process starts elsewhere too)
    second = loader()
    second.load_state_dict(state)
    after, _ = run(second, 1)
    second.close()
    assert before[0] + after[0] == full[0]  # in order: the same samples, order and content


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("batching", ["batch_size", "batch_sampler"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_after_the_last_batch_gives_the_next_epoch_its_own_order(workers, batching, left):
    """Every batch taken, the end not seen. ``num_workers=0`` had not read the sampler to its
    end, where torch's RandomSampler draws one more permutation: the state recorded the
    generator before that draw and the next epoch came in another order. With a user's
    ``batch_sampler`` (torch's BatchSampler) the epoch's length was unknown and the state
    resumed as an empty epoch."""
    def loader():
        g = torch.Generator().manual_seed(5)
        if batching == "batch_size":
            kw = {"batch_size": 4, "shuffle": True, "generator": g}
        else:
            kw = {"batch_sampler": torch.utils.data.BatchSampler(
                torch.utils.data.RandomSampler(range(24), generator=g), 4, False)}
        pipe = hr.Pipeline(ArraySource(24), [hr.step(noise, random=True)])
        return hr.DataLoader(pipe, num_workers=workers, in_order=True, **kw)

    torch.manual_seed(0)  # the base seeds of a batch_sampler's loader: torch's global generator
    full, _ = run(loader(), 2)
    torch.manual_seed(0)
    first = loader()
    it = iter(first)
    for _ in range(6):  # every batch of 24 samples, without asking past the last
        next(it)
    if left:
        it.close()
    state = json.loads(json.dumps(first.state_dict()))
    global_rng = torch.get_rng_state()  # saved with the model, as the docs ask
    assert not state["in_epoch"] and state["epoch"] == 1
    del it
    first.close()
    second = loader()
    second.load_state_dict(state)
    torch.set_rng_state(global_rng)
    after, _ = run(second, 1)
    second.close()
    assert after[0] == full[1]  # in order: the same batches, order and content


class _FailsAtItsEnd:
    """A sampler of 8 indices that raises where it should end."""

    def __iter__(self):
        yield from range(8)
        raise OSError("the index file went away")

    def __len__(self):
        return 8


def test_a_sampler_failing_at_its_end_still_raises_after_a_state_is_taken():
    # state_dict() reads a num_workers=0 sampler's end once every position is delivered; the
    # error it met there must still reach the loop (read again, a generator just ends)
    pipe = hr.Pipeline(ArraySource(8), [hr.step(noise, random=True)])
    loader = hr.DataLoader(pipe, batch_size=4, sampler=_FailsAtItsEnd(), num_workers=0)
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["in_epoch"]  # its end was not reached: the epoch is open
    with pytest.raises(OSError, match="index file went away"):
        next(it)
