import random
import traceback

import numpy as np
import pytest
import torch

import headrace as hr
from headrace.errors import StepError, step_error_for
from headrace.pipeline.runner import SampleRunner
from headrace.pipeline.source import DatasetSource
from tests.helpers import ArraySource, noise


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms


class TupleDataset(torch.utils.data.Dataset):
    def __init__(self, transform=None):
        self.transform = transform

    def __len__(self):
        return 4

    def __getitem__(self, i):
        x = np.full(2, i, dtype=np.float32)
        if self.transform is not None:
            x = self.transform(x)
        return x, i


def add_one(x):
    return x + 1


def double(x):
    return x * 2


def compose_call(self, x):
    for t in self.transforms:
        x = t(x)
    return x


Compose.__call__ = compose_call


def test_step_traits_and_validation():
    s = hr.step(noise, random=True)
    assert s.name == "noise" and s.movable and not s.barrier
    assert hr.step(add_one, kind="decode").barrier
    assert hr.step(add_one, keep_position=True).barrier
    assert not hr.step(add_one).movable
    assert hr.step(add_one, commutes=True).movable
    with pytest.raises(hr.PipelineError):
        hr.step(add_one, kind="bogus")
    with pytest.raises(hr.PipelineError):
        hr.Pipeline(ArraySource(3), [hr.step(add_one, name="load")])


def test_compose_dataset_runs_its_transforms_in_place_measured_per_step():
    tf = Compose([add_one, double])
    ds = TupleDataset(tf)
    p = hr.Pipeline.from_dataset(ds)
    assert p.step_names == ["load", "add_one", "double"] and p.embedded and not p.splittable
    assert ds.transform is tf and tf.transforms == [add_one, double]  # the user's objects untouched
    x, y = p[3]
    assert y == 3 and np.array_equal(x, ds[3][0])
    from headrace.profiler import sizes

    out = SampleRunner(p, sizes.measure).run(3, 0, None, base_seed=1, epoch=0)
    assert [t.step for t in out.timings] == [0, 1, 2]
    assert all(t.bytes_out == 8 for t in out.timings)  # two float32s in, after each transform


def test_an_error_inside_an_embedded_transform_names_that_transform():
    def broken(x):
        raise KeyError("no such key")

    p = hr.Pipeline.from_dataset(TupleDataset(Compose([add_one, broken])))
    out = SampleRunner(p).run(2, 0, None, base_seed=1, epoch=0)
    step, exc, _tb = out.error
    assert p.step_names[step] == "broken" and isinstance(exc, KeyError)


def test_an_unprofiled_embedded_run_gives_the_same_sample_and_its_whole_time_at_load():
    """Runs that are not profiled (most samples in a worker) do not time each transform: the
    load's timing carries the whole sample, and a random Step inside the Compose still gets a
    generator per call, the same draws as in a profiled run."""
    from headrace.profiler import sizes

    jitter = hr.step(noise, random=True)
    ds = TupleDataset(Compose([add_one, jitter, jitter]))  # the random step called twice
    p = hr.Pipeline.from_dataset(ds)
    plain = SampleRunner(p).run(3, 0, None, base_seed=1, epoch=0)
    profiled = SampleRunner(p, sizes.measure).run(3, 0, None, base_seed=1, epoch=0)
    assert np.array_equal(plain.value[0], profiled.value[0])
    assert not np.array_equal(plain.value[0], [4, 4])  # noise from the generators it got
    assert [t.step for t in plain.timings] == [0, 1, 2, 3]
    assert plain.timings[0].wall > 0 and all(t.wall == 0 and t.cpu == 0 for t in plain.timings[1:])
    assert all(t.wall > 0 for t in profiled.timings[1:])


def _load_twice_in_a_child(src, out):
    from headrace.pipeline.timed import Timed

    ds = src.dataset
    first = src.load(1)
    installed = ds.transform  # its wrappers stay installed between calls in a worker
    second = src.load(2)
    ds.transform = Compose([double, add_one])  # the worker's code assigns another: measured from the next
    third = src.load(2)
    out.put((np.array_equal(first[0], [4, 4]), np.array_equal(second[0], [6, 6]),
             isinstance(installed.transforms[0], Timed) and installed.transforms[0].fn is add_one,
             isinstance(ds.transform.transforms[0], Timed) and ds.transform.transforms[0].fn is double,
             np.array_equal(third[0], [5, 5])))


def test_a_worker_process_keeps_the_instrumented_transform_installed():
    """In a process other than the training process the dataset is the worker's own: the
    wrappers are installed once, not swapped in and out per sample; in the training
    process the user's object is put back after each call."""
    import multiprocessing as mp

    from headrace.pipeline.inplace import EmbeddedSource
    from headrace.pipeline.timed import Timed

    tf = Compose([add_one, double])
    ds = TupleDataset(tf)
    src = EmbeddedSource(ds, 2)
    assert np.array_equal(src.load(1)[0], [4, 4]) and ds.transform is tf  # restored here
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_load_twice_in_a_child, args=(src, q))
    child.start()
    got = q.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0 and got == (True, True, True, True, True)
    assert ds.transform is tf and not isinstance(tf.transforms[0], Timed)  # the parent's untouched


def test_plain_dataset_is_opaque():
    p = hr.Pipeline.from_dataset(TupleDataset())
    assert p.opaque and p.step_names == ["load"]
    assert isinstance(p.source, DatasetSource)


def test_fingerprint_tracks_code_and_order():
    a = hr.Pipeline(ArraySource(3), [add_one, double])
    b = hr.Pipeline(ArraySource(3), [add_one, double])
    c = hr.Pipeline(ArraySource(3), [double, add_one])
    d = hr.Pipeline(ArraySource(4), [add_one, double])
    assert a.fingerprint() == b.fingerprint()
    assert len({a.fingerprint(), c.fingerprint(), d.fingerprint()}) == 3


def test_random_streams_depend_on_sample_and_step_not_on_order_or_process():
    s1 = hr.step(noise, name="n1", random=True)
    s2 = hr.step(noise, name="n2", random=True)
    p = hr.Pipeline(ArraySource(8), [s1, s2])
    r = SampleRunner(p)
    a = r.run(5, 0, None, base_seed=42, epoch=1).value
    b = r.run(5, 0, None, base_seed=42, epoch=1).value
    assert np.array_equal(a, b)
    assert not np.array_equal(a, r.run(6, 0, None, base_seed=42, epoch=1).value)
    assert not np.array_equal(a, r.run(5, 0, None, base_seed=42, epoch=2).value)
    # swapping two commuting random steps keeps each one's draws: same result
    q = SampleRunner(hr.Pipeline(ArraySource(8), [s2, s1]))
    assert np.allclose(a, q.run(5, 0, None, base_seed=42, epoch=1).value)


def _py_draw(x):
    return x + random.random()


def _np_draw(x):
    return x + np.random.rand()


def _torch_draw(x):
    return x + float(torch.rand(1))


def _own_generators(x):  # a generator of its own draws nothing from the globals
    return x + np.random.default_rng(3).random() + float(torch.rand(1, generator=torch.Generator()))


def test_the_runner_sees_which_steps_draw_from_the_global_generators():
    steps = [hr.step(_own_generators, name="own"), hr.step(_py_draw, name="py"),
             hr.step(noise, name="rng", random=True), hr.step(_np_draw, name="np"),
             hr.step(_torch_draw, name="torch")]
    p = hr.Pipeline(ArraySource(4), steps)
    seen: list[int] = []
    out = SampleRunner(p, on_global_draw=seen.append).run(2, 0, None, base_seed=1, epoch=0)
    assert out.error is None
    assert [p.step_names[i] for i in seen] == ["py", "np", "torch"]
    # same values as a runner that does not watch (the watch draws nothing itself)
    plain = SampleRunner(p).run(2, 0, None, base_seed=1, epoch=0)
    assert np.array_equal(out.value, plain.value)
    # worker threads do not re-seed the globals, and are watched too (they warn)
    unseeded: list[int] = []
    SampleRunner(p, reseed_globals=False, on_global_draw=unseeded.append).run(2, 0, None, 1, 0)
    assert [p.step_names[i] for i in unseeded] == ["py", "np", "torch"]


def test_runner_hands_off_between_steps_and_resumes_without_rerunning():
    calls = []

    def rec(name):
        def f(x):
            calls.append(name)
            return x + 1

        f.__name__ = name
        return f

    p = hr.Pipeline(ArraySource(2), [rec("a"), rec("b"), rec("c")])
    r = SampleRunner(p)
    out = r.run(1, 0, None, 0, 0, hand_off=lambda nxt, spent: True)  # hand off after `load`
    assert out.next_step == 1 and calls == []  # only `load` ran
    out = r.run(1, 1, out.value, 0, 0, hand_off=lambda nxt, spent: nxt == 2)
    assert out.next_step == 2 and calls == ["a"]
    out = r.run(1, 2, out.value, 0, 0)
    assert out.next_step is None and calls == ["a", "b", "c"]
    assert out.value[0] == 4.0


def test_runner_reports_the_failing_step():
    def boom(x):
        raise KeyError("nope")

    r = SampleRunner(hr.Pipeline(ArraySource(2), [add_one, boom]))
    out = r.run(1, 0, None, 0, 0)
    step, exc, tb = out.error
    assert step == 2 and isinstance(exc, KeyError) and "boom" in tb


def test_step_error_keeps_the_original_type():
    e = step_error_for(ValueError, 7, "decode", "ValueError", "bad", "tb...", worker=1)
    assert isinstance(e, StepError) and isinstance(e, ValueError)
    assert e.index == 7 and e.step == "decode" and "sample index 7" in str(e)
    import pickle

    e2 = pickle.loads(pickle.dumps(e))
    assert isinstance(e2, ValueError) and e2.index == 7 and e2.step == "decode"


def test_sample_root_is_numpys_seed_sequence_bit_for_bit():
    # the cached hashing must give every sample the root NumPy's SeedSequence gives it
    # (changing it would change every sample's random draws); edges of the 32-bit words,
    # base seeds of 1-2 words, epochs and positions past 2**32, interleaved (the cache)
    import random

    from headrace.pipeline.seeding import _MASK64, sample_root

    def numpy_root(b: int, e: int, i: int) -> int:
        ss = np.random.SeedSequence(entropy=b & _MASK64, spawn_key=(e, i))
        lo, hi = ss.generate_state(2, dtype=np.uint32)
        return int(lo) | (int(hi) << 32)

    r = random.Random(11)
    cases = [(0, 0, 0), (2**64 - 1, 2**32, 2**32 - 1), (2**32, 0, 2**32), (-1, 3, 5),
             (2**70 + 9, 1, 2)]
    cases += [(r.choice([0, 1, r.getrandbits(32), r.getrandbits(64), r.getrandbits(r.randrange(1, 64))]),
               r.choice([0, 1, r.randrange(100), 2**33 + r.randrange(9)]),
               r.choice([0, r.randrange(10**6), r.getrandbits(40)])) for _ in range(3000)]
    assert [sample_root(*c) for c in cases] == [numpy_root(*c) for c in cases]


def test_any_sampler_key_gets_a_seed_the_same_as_numpys_for_its_index_key():
    # torch passes whatever the sampler yields to __getitem__: NumPy's and torch's integers
    # are their integer's sample; a string, a tuple, a negative index, a list of indices is a
    # key of its own, hashed, never mistaken for an integer index
    from headrace.pipeline.seeding import _MASK64, index_key, sample_root

    assert index_key(np.int64(5)) == index_key(torch.tensor(5)) == index_key(5) == 5
    assert sample_root(3, 1, np.int64(5)) == sample_root(3, 1, torch.tensor(5)) == sample_root(3, 1, 5)
    keys = ["a", "b", ("a", 1), ("a", 2), -1, -2, [0, 1], [1, 0], (0, 1), 2.5, None, b"a"]
    hashed = [index_key(k) for k in keys]
    assert len(set(hashed)) == len(keys) and all(h >= 2**128 for h in hashed)
    assert index_key(("a", 1)) == index_key(("a", 1))  # a pure function of the key
    # tensors and arrays by value: a tensor's pickle holds its storage's address
    assert index_key([torch.tensor(1), torch.tensor(2)]) == index_key([torch.tensor(1),
                                                                        torch.tensor(2)])
    assert index_key(torch.arange(3)) == index_key(torch.arange(3)) != index_key(torch.arange(4))
    assert index_key(torch.tensor(-3)) == index_key(np.int64(-3)) == index_key(-3)
    assert index_key(np.array([1, 2])) == index_key(np.array([1, 2]))
    # pinned: a sample's draws must not change between releases
    assert index_key("a") == 2**128 | 0xD419DA4FB1121883E91888FC7457F843
    assert sample_root(0, 0, "a") == 0x10230E284186F7E2
    for k in keys:
        ss = np.random.SeedSequence(entropy=7 & _MASK64, spawn_key=(2, index_key(k)))
        lo, hi = ss.generate_state(2, dtype=np.uint32)
        assert sample_root(7, 2, k) == int(lo) | (int(hi) << 32)
    roots = {sample_root(0, 0, k) for k in keys} | {sample_root(0, 0, i) for i in range(100)}
    assert len(roots) == len(keys) + 100


def test_a_repeated_draw_of_a_sample_is_numpys_seed_with_the_draw_in_the_spawn_key():
    # the n-th time an index comes in an epoch (runtime/draws.py) its seed takes n too; the
    # first time (draw 0) keeps the seed every sample always had
    from headrace.pipeline.seeding import index_key, sample_root

    for key in (0, 5, 2**40, "a", -3):
        assert sample_root(9, 1, key, 0) == sample_root(9, 1, key)
        for draw in (1, 2, 2**33):
            ss = np.random.SeedSequence(entropy=9, spawn_key=(1, index_key(key), draw))
            lo, hi = ss.generate_state(2, dtype=np.uint32)
            assert sample_root(9, 1, key, draw) == int(lo) | (int(hi) << 32)
    assert len({sample_root(0, 0, 3, d) for d in range(50)}) == 50


def test_step_seeds_are_pure_and_distinct_across_samples_epochs_and_steps():
    from headrace.pipeline.seeding import sample_seed, step_keys

    keys = step_keys(["load", "Crop", "Flip", "Flip", "Noise"])
    seeds = {(b, e, i, k): sample_seed(b, e, i, k)
             for b in (0, 2**63 + 5) for e in (0, 1) for i in range(500) for k in keys}
    assert len(set(seeds.values())) == len(seeds)  # no two (sample, step) share a stream
    assert all(0 <= s < 2**64 for s in seeds.values())
    assert sample_seed(0, 1, 7, keys[2]) == seeds[(0, 1, 7, keys[2])]  # a pure function


class CorruptSample(Exception):
    def __init__(self, path, code):
        super().__init__(f"bad file {path}")
        self.path, self.code = path, code


class NeedsKeywords(Exception):
    def __init__(self, *, reason):
        super().__init__(reason)
        self.reason = reason


def test_a_step_error_is_the_users_exception_type_whatever_its_init_takes():
    # torch re-raises the exception's type (RuntimeError when it cannot rebuild it); an
    # __init__ of (path, code) or keyword-only arguments no longer drops the type
    from headrace.errors import StepError, step_error_for

    for cls in (CorruptSample, NeedsKeywords):
        e = step_error_for(cls, 4, "load", cls.__qualname__, "msg")
        assert isinstance(e, cls) and isinstance(e, StepError) and e.index == 4
        assert "sample index 4" in str(e)


def test_in_this_process_the_original_exceptions_attributes_are_carried():
    # num_workers=0: torch raises the object itself, so code reads e.errno, e.filename, e.code
    from headrace.errors import step_error_for

    try:
        compile("[", "label", "eval")  # ast.literal_eval on a bad label string, say
    except SyntaxError as e:
        syntax = e
    for exc in (FileNotFoundError(2, "No such file", "/d/1.jpg"), CorruptSample("/d/1.jpg", 7),
                syntax,
                NeedsKeywords(reason="empty"), KeyError("label"), TimeoutError(110, "timed out")):
        e = step_error_for(type(exc), 1, "load", type(exc).__qualname__, str(exc), instance=exc)
        assert isinstance(e, type(exc))
        for name in ("errno", "strerror", "filename", "path", "code", "reason"):
            if hasattr(exc, name):
                assert getattr(e, name) == getattr(exc, name), name
        # str() is headrace's message, naming the place, also where OSError and KeyError
        # would print the errno or a repr
        assert str(e).startswith("step 'load' failed on sample index 1")
        assert e.index == 1 and e.step == "load"
        # as a traceback prints it (a SyntaxError by its msg)
        printed = "".join(traceback.format_exception_only(e))
        assert "sample index 1" in printed, printed
    # and as the training process rebuilds one from a worker's message
    e = step_error_for(SyntaxError, 2, "parse", "SyntaxError", "'[' was never closed")
    assert "sample index 2" in "".join(traceback.format_exception_only(e))


def test_the_watch_reads_numpys_global_generator_whatever_its_bit_generator():
    from headrace.pipeline.draw_marks import draw_mark

    before = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(5))  # a user's choice since NumPy 1.25
    try:
        token = draw_mark()
        assert draw_mark() == token
        np.random.rand()
        assert draw_mark() != token
    finally:
        np.random.set_bit_generator(before)


@pytest.mark.parametrize("seed", [0, 7, 2**63 - 1])
@pytest.mark.parametrize("draw", [lambda: torch.rand(1), lambda: torch.randn(1),
                                  lambda: torch.randint(0, 9, (2,)), lambda: None])
def test_the_mark_after_seeding_is_the_one_read_and_tells_a_torch_draw(seed, draw):
    from headrace.pipeline.draw_marks import draw_mark, seeded_mark
    from headrace.pipeline.seeding import seed_numpy_torch

    saved = torch.get_rng_state()
    try:
        seed_numpy_torch(seed)
        before = seeded_mark()
        assert before == draw_mark()  # torch's part, not read, is what a read gives
        drew = draw() is not None
        assert (draw_mark() != before) == drew
    finally:
        torch.set_rng_state(saved)


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1])
def test_seed_globals_seeds_as_the_libraries_own_seed_functions_do(seed):
    from headrace.pipeline.seeding import seed_globals

    random.seed(3)
    random.gauss(0, 1)  # a cached second Gaussian, which random.seed forgets
    seed_globals(seed)
    ours = random.getstate(), np.random.get_state(legacy=False), torch.get_rng_state()
    random.gauss(0, 1)
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch.manual_seed(seed & 0x7FFFFFFFFFFFFFFF)
    assert ours[0] == random.getstate()
    assert ours[1]["state"]["key"].tolist() == np.random.get_state(legacy=False)["state"]["key"].tolist()
    assert ours[1]["state"]["pos"] == np.random.get_state(legacy=False)["state"]["pos"]
    assert torch.equal(ours[2], torch.get_rng_state())


class _Drawing:
    """Steps that record each call and draw from Python's global generator as told."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    def gauss_every(self, x):  # two Gaussians at a time: the second waits in gauss_next
        self.calls.append(("gauss_every", int(x[0])))
        return np.array([x[0], random.gauss(0, 1)])

    def gauss_odd(self, x):  # takes the cached Gaussian, on odd samples only
        self.calls.append(("gauss_odd", int(x[0])))
        return np.append(x, random.gauss(0, 1) if int(x[0]) % 2 else 0.0)

    def none(self, x):
        self.calls.append(("none", int(x[0])))
        return x

    def fail_on_three(self, x):  # draws, then fails, on sample 3
        self.calls.append(("fail_on_three", int(x[0])))
        if int(x[0]) == 3:
            raise ValueError(f"bad draw {random.random()}")
        return x


def _seeded_python(base_seed, epoch, index, key):
    from headrace.pipeline.seeding import sample_root, step_seed

    random.seed(step_seed(sample_root(base_seed, epoch, index), key))


def test_python_generator_is_seeded_before_the_steps_that_draw_from_it_only():
    from headrace.pipeline.draw_marks import PYTHON_MARKS

    assert PYTHON_MARKS  # CPython's layout, checked at import
    d = _Drawing()
    p = hr.Pipeline(ArraySource(6), [hr.step(d.none, name="none"),
                                     hr.step(d.gauss_every, name="gauss_every"),
                                     hr.step(d.gauss_odd, name="gauss_odd")])
    runner = SampleRunner(p)
    values = [runner.run(i, 0, None, base_seed=9, epoch=1).value for i in range(6)]
    for i, v in enumerate(values):  # what seeding Python's generator before every step gives
        _seeded_python(9, 1, i, p.keys[2])
        first = random.gauss(0, 1)
        _seeded_python(9, 1, i, p.keys[3])
        second = random.gauss(0, 1) if i % 2 else 0.0
        assert v.tolist() == [i, first, second], (i, v)
    assert runner.python_draws == [False, False, True, True]
    # a step's first draw in this process runs its sample again: sample 0 for gauss_every,
    # sample 1 for gauss_odd (which drew nothing on sample 0); every other sample runs once
    runs = [sum(1 for name, k in d.calls if name == "none" and k == i) for i in range(6)]
    assert runs == [2, 2, 1, 1, 1, 1], d.calls


def test_a_step_that_fails_after_an_unseeded_draw_fails_as_seeded():
    d = _Drawing()
    p = hr.Pipeline(ArraySource(5), [hr.step(d.fail_on_three, name="fail_on_three")])
    runner = SampleRunner(p)
    out = [runner.run(i, 0, None, base_seed=4, epoch=0) for i in range(5)]
    assert [o.error is None for o in out] == [True, True, True, False, True]
    _seeded_python(4, 0, 3, p.keys[1])
    assert str(out[3].error[1]) == f"bad draw {random.random()}"
    assert [k for _, k in d.calls] == [0, 1, 2, 3, 3, 4]  # sample 3 ran again, seeded


def test_runs_that_cannot_start_over_seed_python_before_every_step():
    d = _Drawing()
    p = hr.Pipeline(ArraySource(4), [hr.step(d.none, name="none"),
                                     hr.step(d.gauss_every, name="gauss_every")])
    runner = SampleRunner(p)
    x = runner.run(2, 0, None, base_seed=1, epoch=0, hand_off=lambda step, _s: step == 2)
    assert x.next_step == 2
    resumed = runner.run(2, 2, x.value, base_seed=1, epoch=0)  # a hand-off's second half
    _seeded_python(1, 0, 2, p.keys[2])
    assert resumed.value.tolist() == [2, random.gauss(0, 1)]
    assert runner.python_draws == [False, False, False]  # seeded: nothing to learn


def test_a_run_inserting_into_the_cache_runs_again_and_gives_each_output_once():
    d = _Drawing()
    p = hr.Pipeline(ArraySource(4), [hr.step(d.none, name="none"),
                                     hr.step(d.gauss_every, name="gauss_every")])
    runner = SampleRunner(p)
    stored: list[tuple[int, object]] = []
    drew: list[int] = []
    cached = runner.run(3, 0, None, base_seed=1, epoch=0,
                        after_step=lambda step, x: stored.append((step, x)), on_drew=drew.append)
    _seeded_python(1, 0, 3, p.keys[2])
    assert cached.value.tolist() == [3, random.gauss(0, 1)]
    assert [step for step, _ in stored] == [0, 1, 2]  # the first run's two, the second's last
    assert stored[2][1].tolist() == cached.value.tolist()
    assert [k for name, k in d.calls if name == "none"] == [3, 3]  # ran again from its start
    assert runner.python_draws == [False, False, True] and drew == [2]


def test_draws_after_the_last_step_watched_are_not_told():
    d = _Drawing()
    p = hr.Pipeline(ArraySource(4), [hr.step(d.gauss_every, name="gauss_every"),
                                     hr.step(_np_jitter, name="np_jitter")])
    runner = SampleRunner(p, python_draws=[False, True, False])
    for through, told in ((None, [1, 2]), (2, [1, 2]), (1, [1]), (0, []), (-1, [])):
        drew: list[int] = []
        runner.run(1, 0, None, base_seed=1, epoch=0, on_drew=drew.append, drew_through=through)
        assert drew == told, through


def _np_jitter(x):
    return x + np.random.random()


def _py_jitter(x):
    return x + random.random()


def test_a_datasets_own_transforms_draw_from_python_seeded_per_sample():
    p = hr.Pipeline.from_dataset(TupleDataset(Compose([add_one, _py_jitter])))
    assert p.embedded
    runner = SampleRunner(p)
    for i in range(4):
        x, label = runner.run(i, 0, None, base_seed=2, epoch=3).value
        _seeded_python(2, 3, i, p.keys[0])  # seeded once, before the dataset's __getitem__
        assert label == i and x.tolist() == (np.full(2, i + 1, np.float32) + random.random()).tolist()
    assert runner.python_draws[0]
