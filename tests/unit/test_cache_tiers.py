"""Which forms a pipeline caches and how their keys change (pure)."""

from __future__ import annotations

import headrace as hr
from headrace.cache.tiers import TierLayout
from tests.helpers import IndexDataset


class Src:
    def __len__(self) -> int:
        return 10

    def load(self, i: int) -> int:
        return i


def dec(x):
    return x


def crop(x, rng):
    return x


def flip(x, rng):
    return x


def norm(x):
    return x


def norm2(x):
    return x + 0


def _layout(steps, shared=False, opaque=False):
    return TierLayout.for_pipeline(hr.Pipeline(Src(), steps, opaque=opaque), shared)


def _pos(layout):
    return {t.name: t.position for t in layout.tiers}


def test_positions_follow_the_executed_order() -> None:
    steps = [hr.step(dec, kind="decode"), hr.step(crop, random=True), hr.step(flip, random=True),
             hr.step(norm)]
    lay = _layout(steps)
    assert lay.names == ("augmented", "decoded", "encoded")  # lookup order
    assert _pos(lay) == {"encoded": 0, "decoded": 1, "augmented": 4}
    # AutoOrder moved a deterministic step before the first random one: decoded covers it
    moved = _layout([steps[0], steps[3], steps[1], steps[2]])
    assert _pos(moved) == {"encoded": 0, "decoded": 2, "augmented": 4}
    assert [t.seeded for t in lay.tiers] == [True, False, False]


def test_a_step_declared_an_augmentation_ends_the_deterministic_prefix() -> None:
    # kind="augment" without random=True (a transform drawing from a generator of its own):
    # its first epoch's output was cached as the decoded form and served every later epoch
    steps = [hr.step(dec, kind="decode"), hr.step(norm, kind="augment"), hr.step(norm2)]
    lay = _layout(steps)
    assert _pos(lay) == {"encoded": 0, "decoded": 1, "augmented": 3}
    assert [t.seeded for t in lay.tiers] == [True, False, False]


def test_forms_on_one_position_merge() -> None:
    assert _pos(_layout([hr.step(dec), hr.step(norm)])) == {"encoded": 0, "decoded": 2}
    assert _pos(_layout([hr.step(crop, random=True), hr.step(norm)])) == {"encoded": 0, "augmented": 2}
    assert _pos(_layout([])) == {"decoded": 0}
    opaque = TierLayout.for_pipeline(hr.Pipeline.from_dataset(IndexDataset(5)))
    assert _pos(opaque) == {"augmented": 0} and opaque.tiers[0].seeded


def test_keys_change_with_the_prefix_only() -> None:
    a = _layout([hr.step(dec), hr.step(crop, random=True), hr.step(norm)])
    b = _layout([hr.step(dec), hr.step(crop, random=True), hr.step(norm2, name="norm")])
    assert a.get("decoded").namespace(1, 0) == b.get("decoded").namespace(1, 0)
    assert a.get("augmented").namespace(1, 0) != b.get("augmented").namespace(1, 0)
    c = _layout([hr.step(norm2, name="dec"), hr.step(crop, random=True), hr.step(norm)])
    assert a.get("decoded").namespace(1, 0) != c.get("decoded").namespace(1, 0)
    assert a.get("encoded").namespace(1, 0) == c.get("encoded").namespace(1, 0)


def test_seeded_forms_are_keyed_by_seed_and_epoch_unless_shared() -> None:
    steps = [hr.step(dec), hr.step(crop, random=True)]
    aug = _layout(steps).get("augmented")
    assert aug.namespace(1, 0) != aug.namespace(1, 1) != aug.namespace(2, 0)
    dec_t = _layout(steps).get("decoded")
    assert dec_t.namespace(1, 0) == dec_t.namespace(2, 5)
    shared = _layout(steps, shared=True).get("augmented")
    assert shared.shared and shared.namespace(1, 0) == shared.namespace(2, 5)


def test_a_whole_dataset_form_saves_its_transforms_time_too() -> None:
    """A dataset whose Compose runs inside ``__getitem__`` caches one form, the whole sample;
    the runner times its transforms as steps after load, and all of it is what a hit saves."""
    import multiprocessing as mp

    from headrace.cache.client import MIN_MEASURED, CacheClient, Counters
    from headrace.pipeline.runner import StepTiming

    layout = TierLayout.for_pipeline(hr.Pipeline(Src(), [], opaque=True))
    assert _pos(layout) == {"augmented": 0} and layout.steps == 1
    client = CacheClient(layout, None, Counters(mp.get_context("fork"), 1), ("augmented",))
    for _ in range(MIN_MEASURED):  # load 1 ms of its own, then transforms of 2 and 3 ms
        client.observe([StepTiming(0, 0.001, 0.001), StepTiming(1, 0.002, 0.002),
                        StepTiming(2, 0.003, 0.003)], row=0)
    assert abs(client.counters.cost("augmented", 1) - 0.006) < 1e-12
    split = TierLayout.for_pipeline(hr.Pipeline(Src(), [hr.step(dec), hr.step(crop, random=True)]))
    c2 = CacheClient(split, None, Counters(mp.get_context("fork"), 1), ("decoded", "augmented"))
    for _ in range(MIN_MEASURED):  # a step-by-step pipeline: each form its own prefix
        c2.observe([StepTiming(0, 0.001, 0.001), StepTiming(1, 0.002, 0.002),
                    StepTiming(2, 0.003, 0.003)], row=0)
    assert _pos(split) == {"encoded": 0, "decoded": 1, "augmented": 2}
    assert abs(c2.counters.cost("decoded", 1) - 0.003) < 1e-12
    assert abs(c2.counters.cost("augmented", 1) - 0.006) < 1e-12


def test_a_form_its_steps_make_in_about_a_copys_time_is_not_stored() -> None:
    """Storing copies a form twice and a hit once more: a cheap decode of a large array never
    pays (a sweep: the default cache made such a first epoch 2.3x slower)."""
    import multiprocessing as mp

    from headrace.cache.client import MIN_MEASURED, PROBE_EVERY, CacheClient, Counters
    from headrace.pipeline.runner import StepTiming

    layout = TierLayout.for_pipeline(hr.Pipeline(Src(), [hr.step(dec), hr.step(crop, random=True)]))

    def client(decode_s: float) -> CacheClient:
        c = CacheClient(layout, None, Counters(mp.get_context("fork"), 1), ("decoded",))
        assert c.worth_storing("decoded")  # nothing measured yet: stored
        for _ in range(MIN_MEASURED):
            c.observe([StepTiming(0, 0.0, 0.0), StepTiming(1, decode_s, decode_s)], row=0)
            c.encoded("decoded", 0.001)  # encoding took a millisecond
        return c

    cheap = client(0.002)  # the decode it saves: 2 ms, under 3 encodings
    assert sum(cheap.worth_storing("decoded") for _ in range(PROBE_EVERY)) == 1  # a probe
    dear = client(0.004)
    assert all(dear.worth_storing("decoded") for _ in range(PROBE_EVERY))
