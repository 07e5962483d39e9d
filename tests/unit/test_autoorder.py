"""AutoOrder (Pecan §5.2) on Pecan's examples, barriers, the neutral band and revalidation."""

from __future__ import annotations

import numpy as np
import pytest

from headrace.pipeline import Pipeline, Step, step
from headrace.pipeline.runner import StepTiming
from headrace.pipeline.seeding import step_rng
from headrace.planner.autoorder import (
    NEUTRAL_BAND,
    autoorder,
    autoorder_from_profile,
    classify,
    expected_cpu,
)
from headrace.planner.order_revalidation import revalidate
from headrace.profiler.sizes import payload_bytes, shape_signature, type_signature
from headrace.profiler.stats import PipelineProfile, Profiler


def ident(x):
    return x


def ident_rng(x, rng):
    return x


def aug(name: str) -> Step:
    return step(ident_rng, name=name, random=True)


def names(steps) -> list[str]:
    return [s.name for s in steps]


def keep_all(steps) -> list[bool]:
    """Every step kept dtype and shape: tests of other rules than the shape rule."""
    return [True] * len(steps)


def resnet_steps() -> list[Step]:
    """Pecan Table 1, ResNet50: Resize declared after the flip/rotate/shear augmentations."""
    return [
        step(ident, name="Decode", kind="decode"),
        aug("Flip"),
        aug("Rotate"),
        aug("Shear"),
        step(ident, name="Resize", commutes=True),
        step(ident, name="Normalize", keep_position=True),
    ]


def test_resnet50_resize_moves_in_front_of_the_augmentations():
    steps = resnet_steps()
    # the augmentations keep the image's shape; Resize changes it
    keeps = [False, True, True, True, False, False]
    d = autoorder(steps, [8.0, 1.0, 1.0, 1.0, 0.21, 4.0], keeps_shape=keeps)
    assert names(d.steps) == ["Decode", "Resize", "Flip", "Rotate", "Shear", "Normalize"]
    assert d.changed and d.order == (0, 4, 1, 2, 3, 5)
    assert d.sections == ((1, 2, 3, 4),)
    (move,) = d.moves
    assert move.step == "Resize" and move.role == "deflationary"
    assert move.crossed == ("Flip", "Rotate", "Shear")
    assert move.reason.startswith("moved Resize before Flip, Rotate, Shear: inflation 0.21")
    assert d.roles == ("barrier", "neutral", "neutral", "neutral", "deflationary", "barrier")


def test_random_resized_crop_moves_before_the_flips_but_not_across_to_tensor():
    steps = [
        step(ident, name="Decode", kind="decode"),
        aug("Flip"),
        aug("Rotate"),
        step(ident_rng, name="RandomResizedCrop", random=True),
        step(ident, name="ToTensor", commutes=True),
        aug("ColorJitter"),
    ]
    changes = [True, False, False, False, True, False]
    keeps = [False, True, True, False, False, True]
    d = autoorder(steps, [6.0, 1.0, 1.0, 0.3, 4.0, 0.5], changes_type=changes, keeps_shape=keeps)
    assert names(d.steps) == [
        "Decode", "RandomResizedCrop", "Flip", "Rotate", "ToTensor", "ColorJitter",
    ]  # fmt: skip
    assert [m.step for m in d.moves] == ["RandomResizedCrop"]
    assert d.roles[4] == "barrier"
    assert any("ToTensor changes the sample's type, rank or dtype" in n for n in d.notes)


def test_speech_pad_moves_after_the_augmentations():
    """Pecan §6.3, ASRTrans: Pad moves after SpecAugment, SpeedPerturb, PitchPerturb, Reverb."""
    steps = [
        step(ident, name="DecodeAudio", kind="decode"),
        step(ident, name="Pad", commutes=True),
        aug("SpecAugment"),
        aug("SpeedPerturb"),
        aug("PitchPerturb"),
        aug("Reverb"),
    ]
    factors = [10.0, 1.6, 1.0, 1.03, 0.98, 1.0]
    d = autoorder(steps, factors, keeps_shape=[False, False, True, True, True, True])
    assert names(d.steps) == [
        "DecodeAudio", "SpecAugment", "SpeedPerturb", "PitchPerturb", "Reverb", "Pad",
    ]  # fmt: skip
    (move,) = d.moves
    assert move.role == "inflationary" and move.inflation == pytest.approx(1.6)
    assert move.reason.startswith("moved Pad after SpecAugment, SpeedPerturb, PitchPerturb, Reverb")
    # a SpeedPerturb that changes the length: padding before it or after it gives other
    # lengths, so Pad stays before it and moves after the others only
    d = autoorder(steps, factors, keeps_shape=[False, False, True, False, True, True])
    assert names(d.steps) == [
        "DecodeAudio", "SpecAugment", "PitchPerturb", "Reverb", "Pad", "SpeedPerturb",
    ]  # fmt: skip
    assert d.moves[0].crossed == ("SpecAugment", "PitchPerturb", "Reverb")
    assert any(n.startswith("SpeedPerturb stays after Pad") for n in d.notes), d.notes


def test_keep_position_splits_sections_and_nothing_crosses_it():
    steps = [aug("A"), aug("B"), step(ident, name="Keep", keep_position=True), aug("C"), aug("D")]
    d = autoorder(steps, [1.0, 0.5, 0.1, 3.0, 0.2], keeps_shape=keep_all(steps))
    assert names(d.steps) == ["B", "A", "Keep", "D", "C"]
    assert d.sections == ((0, 1), (3, 4))
    assert d.steps[2].name == "Keep"
    # the deflationary Keep (0.1) would gain most by moving first, but it is a barrier
    assert d.roles[2] == "barrier"


@pytest.mark.parametrize(("kind", "keep"), [("decode", False), ("transform", True)])
def test_a_barrier_never_moves_whatever_its_factor(kind, keep):
    barrier = Step(fn=ident_rng, name="X", random=True, kind=kind, keep_position=keep)
    steps = [aug("A"), aug("B"), barrier, aug("C")]
    for factors in ([1.0, 1.0, 0.01, 1.0], [1.0, 1.0, 50.0, 1.0]):
        d = autoorder(steps, factors, keeps_shape=keep_all(steps))
        assert names(d.steps) == ["A", "B", "X", "C"] and not d.moves


def test_a_type_changing_step_never_moves():
    steps = [aug("Flip"), aug("ToFloat"), aug("Crop")]
    keeps = [True, False, False]
    d = autoorder(steps, [1.0, 0.3, 0.5], changes_type=[False, True, False], keeps_shape=keeps)
    assert names(d.steps) == ["Flip", "ToFloat", "Crop"]  # Crop may not cross ToFloat either
    assert d.roles[1] == "barrier"
    d2 = autoorder(steps, [1.0, 0.3, 0.5], keeps_shape=keeps)  # without the type change: moves
    assert names(d2.steps) == ["ToFloat", "Crop", "Flip"]


@pytest.mark.parametrize(
    ("factor", "moves"),
    [(0.94, True), (0.95, False), (0.99, False), (1.0, False), (1.05, False), (1.06, True)],
)
def test_neutral_band(factor, moves):
    # a factor within [0.95, 1.05] counts as 1: the step stays
    first, last = (aug("S"), aug("N")) if factor > 1 else (aug("N"), aug("S"))
    d = autoorder([first, last], [factor, 1.0] if factor > 1 else [1.0, factor],
                  keeps_shape=[True, True])
    assert d.changed is moves
    assert classify(factor) == ("neutral" if not moves else d.moves[0].role)


def test_classify_bounds_and_unknown():
    assert NEUTRAL_BAND == (0.95, 1.05)
    assert classify(0.2) == "deflationary" and classify(2.0) == "inflationary"
    assert classify(None) == "unknown" and classify(float("nan")) == "unknown"
    assert classify(0.9, neutral=(0.8, 1.2)) == "neutral"


def test_non_movable_steps_stay_and_bound_sections():
    resize = step(ident, name="Resize")  # neither random nor commutes
    steps = [aug("Flip"), aug("Rotate"), resize, aug("Crop"), aug("Blur")]
    d = autoorder(steps, [1.0, 1.0, 0.2, 1.0, 0.5], keeps_shape=keep_all(steps))
    assert names(d.steps) == ["Flip", "Rotate", "Resize", "Blur", "Crop"]
    assert d.roles[2] == "fixed" and d.sections == ((0, 1), (3, 4))
    assert any("Resize is deflationary (0.20)" in n and "commutes=True" in n for n in d.notes)


def test_ties_keep_the_declared_order():
    steps = [aug("I1"), aug("N1"), aug("D1"), aug("I2"), aug("N2"), aug("D2")]
    d = autoorder(steps, [2.0, 1.0, 0.5, 3.0, 1.0, 0.1], keeps_shape=keep_all(steps))
    # unlike Algorithm 2's Prepend, deflationary steps keep their relative order (D1 before D2)
    assert names(d.steps) == ["D1", "D2", "N1", "N2", "I1", "I2"]
    again = autoorder(d.steps, [0.5, 0.1, 1.0, 1.0, 2.0, 3.0], keeps_shape=keep_all(steps))
    assert not again.changed  # a chosen order is a fixed point


def test_unknown_factors_are_neutral_with_a_note():
    d = autoorder([aug("A"), aug("B"), aug("C")], [None, 0.5, 1.0], keeps_shape=[True] * 3)
    assert names(d.steps) == ["B", "A", "C"]
    assert d.roles[0] == "unknown" and any(
        "no inflation factor measured for A" in n for n in d.notes
    )


def test_expected_cpu_model():
    # step cost proportional to input bytes: 4 ms at 1000 B, 2 ms at 1000 B, resize 1 ms
    cpu, bytes_in, factors = [0.004, 0.002, 0.001], [1000.0, 1000.0, 1000.0], [1.0, 1.0, 0.25]
    assert expected_cpu([0, 1, 2], cpu, bytes_in, factors, 1000.0) == pytest.approx(0.007)
    assert expected_cpu([2, 0, 1], cpu, bytes_in, factors, 1000.0) == pytest.approx(0.0025)
    steps = [aug("Flip"), aug("Rotate"), step(ident, name="Resize", commutes=True)]
    d = autoorder(steps, factors, cpu=cpu, bytes_in=bytes_in, keeps_shape=[True, True, False])
    assert d.cpu_before == pytest.approx(0.007) and d.cpu_after == pytest.approx(0.0025)
    text = "\n".join(d.explain())
    assert "expected per-sample CPU 7.0 ms -> 2.5 ms" in text
    assert "1.0 KB -> 250 B per sample" in text
    assert autoorder(steps, factors).cpu_before is None  # no costs, no estimate
    assert "up:" not in text  # it goes down


def test_an_order_the_cost_model_finds_dearer_is_said_to_be():
    """Pecan Alg. 2 moves a deflationary step (0.94, 10 ms) before one in the neutral band that
    still shrinks samples 4% (0.96, 1 ms): the cheap one reads smaller samples, the dear one
    larger ones, and the model's CPU goes up, 11.0 -> 11.4 ms. The text said only "so it runs
    on smaller samples" beside the rise; it now says which way the estimate goes and why."""
    steps = [aug("neutral_cheap"), aug("defl_costly")]
    d = autoorder(steps, [0.96, 0.94], keeps_shape=[True, True], cpu=[0.001, 0.010],
                  bytes_in=[1e6, 0.96e6], input_bytes=1e6)
    assert names(d.steps) == ["defl_costly", "neutral_cheap"]  # the factors decide (Pecan)
    assert d.cpu_after > d.cpu_before
    line = next(x for x in d.explain() if "expected per-sample CPU" in x)
    assert "11.0 ms -> 11.4 ms, up:" in line
    assert "the moved steps read larger ones" in line


def test_misaligned_inputs_are_rejected():
    with pytest.raises(ValueError, match="inflation has 1 entries for 2 steps"):
        autoorder([aug("A"), aug("B")], [1.0])


def test_nothing_to_do_explains_itself():
    d = autoorder([aug("A"), aug("B")], [1.0, 1.0])
    assert not d.changed and d.moves == ()
    assert d.explain()[0].startswith("AutoOrder: kept the declared order")


# -- from a measured profile ------------------------------------------------------------------


class Images:
    """Raw 'encoded' images of varying size (bytes), like JPEG files."""

    def __len__(self) -> int:
        return 64

    def load(self, index: int) -> bytes:
        side = 48 + (index % 5) * 8
        return np.full((side, side, 3), index % 251, dtype=np.uint8).tobytes()


def decode(raw: bytes) -> np.ndarray:
    side = int(round((len(raw) / 3) ** 0.5))
    return np.frombuffer(raw, dtype=np.uint8).reshape(side, side, 3).astype(np.float32)


def flip(x: np.ndarray, rng) -> np.ndarray:
    return x[:, ::-1].copy() if rng.random() < 0.5 else x


def rotate(x: np.ndarray, rng) -> np.ndarray:
    return np.rot90(x, int(rng.integers(4))).copy()


def resize(x: np.ndarray) -> np.ndarray:
    idx = np.linspace(0, x.shape[0] - 1, 16).astype(int)
    return x[idx][:, idx]


def to_chw(x: np.ndarray) -> tuple:
    return (x.transpose(2, 0, 1).copy(),)  # a type change: array -> tuple


def measure(pipe: Pipeline, n: int) -> PipelineProfile:
    """What the runtime's step hooks do: time, payload size and type signature per step."""
    prof = Profiler(pipe.step_names)
    for i in range(n):
        x = pipe.source.load(i)
        timings = [StepTiming(0, 1e-4, 1e-4)]
        sizes, changed, reshaped = [payload_bytes(x)], [False], [False]
        for j, s in enumerate(pipe.steps, start=1):
            y = s(x, step_rng(i) if s.random else None)
            timings.append(
                StepTiming(j, 1e-4 * payload_bytes(x) / 1e4, 1e-4 * payload_bytes(x) / 1e4)
            )
            sizes.append(payload_bytes(y))
            changed.append(type_signature(x) != type_signature(y))
            reshaped.append(shape_signature(x) != shape_signature(y))
            x = y
        prof.observe(timings, sizes, changes_type=changed, reshapes=reshaped)
    return prof.report()


def test_measured_pipeline_end_to_end_then_revalidated():
    pipe = Pipeline(
        Images(),
        [
            step(decode, kind="decode"),
            step(flip, random=True),
            step(rotate, random=True),
            step(resize, commutes=True),
            step(to_chw, commutes=True),
        ],
    )
    profile = measure(pipe, 32)
    assert profile.step("resize").inflation < 0.3 and profile.step("to_chw").changes_type
    d = autoorder_from_profile(pipe.steps, profile)
    assert names(d.steps) == ["decode", "resize", "flip", "rotate", "to_chw"]
    assert d.roles[-1] == "barrier"  # detected from the type signatures, not declared
    assert d.cpu_after < d.cpu_before
    assert d.notes[0] == "inflation factors from 32 samples"
    # epoch 1 measured on the reordered pipeline: the order holds
    new_profile = measure(pipe.with_steps(d.steps), 64)
    check = revalidate(d, new_profile)
    assert check.holds and check.changes == ()
    assert check.decision.order == d.order


RESNET_SIZES = [1000, 8000, 8000, 8000, 8000, 1680, 6720]
"""Output bytes per step of ``resnet_steps`` (load first): Resize deflates 8000 to 1680."""
RESNET_RESHAPED = [False, True, False, False, False, True, True]
"""Which of those steps change the shape: the augmentations keep it."""


def _resnet_profile(steps, sizes, sized: int, unsized: int = 0) -> Profiler:
    """A profiler fed ``sized`` samples with ``sizes`` (and ``RESNET_RESHAPED``) and
    ``unsized`` samples by their times alone."""
    prof = Profiler(["load", *names(steps)])
    for _ in range(sized):
        prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(7)], sizes,
                     reshapes=RESNET_RESHAPED)
    for _ in range(unsized):
        prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(7)], None)
    return prof


def test_the_decision_names_the_samples_its_inflation_factors_come_from():
    """Most samples from workers carry times only: the note counts those with sizes."""
    steps = resnet_steps()
    profile = _resnet_profile(steps, RESNET_SIZES, sized=40, unsized=260).report()
    assert profile.samples == 300
    d = autoorder_from_profile(steps, profile)
    assert [m.step for m in d.moves] == ["Resize"]
    assert d.notes[0] == "inflation factors from 40 samples"


def test_revalidate_reports_a_step_whose_class_changed():
    steps = resnet_steps()
    d = autoorder_from_profile(steps, _resnet_profile(steps, RESNET_SIZES, sized=5).report())
    assert [m.step for m in d.moves] == ["Resize"]
    sizes = [1000, 8000, 8000, 8000, 8000, 8000, 32000]  # Resize is now neutral (1.00)
    check = revalidate(d, _resnet_profile(steps, sizes, sized=5).report())
    assert not check.holds
    assert check.changes == ("Resize: deflationary (0.21) -> neutral (1.00)",)
    assert not check.decision.changed  # back to the declared order


def test_repeated_step_names_match_by_occurrence():
    steps = [aug("Flip"), aug("Crop"), aug("Crop")]
    prof = Profiler(["load", "Flip", "Crop", "Crop"])
    prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(4)], [100, 100, 50, 50],
                 reshapes=[False, False, True, False])
    d = autoorder_from_profile(steps, prof.report())
    assert d.factors == (1.0, 0.5, 1.0) and d.order == (1, 0, 2) and d.held == ()


def test_steps_that_share_a_name_never_swap_and_the_decision_says_why():
    # the second Crop is deflationary: moving it before the first would swap two steps told
    # apart by their place among the Crops (profile entries, random streams, a state dict's
    # order); AutoOrder planned that order although the loader could not run it
    steps = [aug("Crop"), aug("Flip"), aug("Crop")]
    prof = Profiler(["load", "Crop", "Flip", "Crop"])
    prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(4)], [100, 100, 100, 50],
                 reshapes=[False, False, False, True])
    d = autoorder_from_profile(steps, prof.report())
    assert d.factors == (1.0, 1.0, 0.5)
    assert d.order == (0, 1, 2) and not d.changed and d.moves == ()
    (why,) = d.held
    assert why.startswith("Crop (steps 1 and 3 of the declared order) would swap places")
    assert d.explain()[0] == ("AutoOrder: kept the declared order (its order would have "
                              "swapped steps that share a name; see the note)")
    assert f"  note: {why}" in d.explain()
    # other steps still move across steps that share a name, which keep their order
    flip_first = [aug("Flip"), aug("Crop"), aug("Crop")]
    d = autoorder(flip_first, [1.0, 0.5, 0.5], keeps_shape=[True, False, False])
    assert names(d.steps) == ["Crop", "Crop", "Flip"] and d.order == (1, 2, 0) and d.held == ()


# -- the shape rule: two steps swap only when one of them keeps dtype and shape ---------------


def test_two_steps_that_change_the_shape_keep_their_declared_order():
    # a scale jitter (x1 or x2 per side: 2.5x the bytes on average) then a fixed 32x32 crop:
    # the crop first gave 32x32 or 64x64 samples, and the next epoch's collate failed
    steps = [aug("scale_jitter"), aug("random_crop")]
    d = autoorder(steps, [2.5, 0.16], keeps_shape=[False, False])
    assert not d.changed and d.moves == ()
    assert d.explain()[0] == ("AutoOrder: kept the declared order (its order would have "
                              "swapped steps that both change the sample's dtype or shape; see "
                              "the note)")
    assert d.apart and any(n.startswith("random_crop stays after scale_jitter: both changed the sample's "
                            "dtype or shape") for n in d.notes), d.notes
    # a flip keeps the shape: the crop moves before it
    d = autoorder([aug("flip"), aug("random_crop")], [1.0, 0.16], keeps_shape=[True, False])
    assert names(d.steps) == ["random_crop", "flip"]


def test_shape_changing_steps_keep_their_order_while_others_move_across_them():
    steps = [aug("Flip"), aug("Cast"), aug("Rotate"), aug("Crop"), aug("Blur")]
    # Cast (to uint8: 0.25) and Crop (0.3) change dtype / shape: Crop stays after Cast, yet
    # both move before the shape-keeping augmentations
    d = autoorder(steps, [1.0, 0.25, 1.0, 0.3, 1.0], keeps_shape=[True, False, True, False, True])
    assert names(d.steps) == ["Cast", "Crop", "Flip", "Rotate", "Blur"]
    d = autoorder(steps, [1.0, 4.0, 1.0, 0.3, 1.0], keeps_shape=[True, False, True, False, True])
    # Cast to float64 (4.0) would go last, after the Crop: not across another reshaping step
    assert names(d.steps) == ["Flip", "Rotate", "Blur", "Cast", "Crop"]
    assert any(n.startswith("Crop stays after Cast") for n in d.notes), d.notes


def test_a_step_never_measured_for_shape_counts_as_changing():
    steps = [aug("Flip"), aug("Crop")]
    prof = Profiler(["load", "Flip", "Crop"])
    for _ in range(3):  # sizes measured, but not whether the steps kept dtype and shape
        prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(3)], [100, 100, 25])
    report = prof.report()
    assert report.step("Flip").reshapes is None and not report.step("Flip").keeps_shape
    assert not autoorder_from_profile(steps, report).changed
    # a profile stored before headrace recorded it reads the same
    old = report.to_dict()
    for st in old["steps"]:
        del st["reshapes"]
    again = PipelineProfile.from_dict(old)
    assert again.step("Flip").reshapes is None
    assert not autoorder_from_profile(steps, again).changed
    # measured: Flip kept the shape on every sample, so the crop moves before it
    prof = Profiler(["load", "Flip", "Crop"])
    for _ in range(3):
        prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(3)], [100, 100, 25],
                     reshapes=[False, False, True])
    d = autoorder_from_profile(steps, prof.report())
    assert names(d.steps) == ["Crop", "Flip"]
    # one sample where Flip changed the shape is enough to keep the order
    prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(3)], [100, 100, 25],
                 reshapes=[False, True, True])
    assert not autoorder_from_profile(steps, prof.report()).changed
