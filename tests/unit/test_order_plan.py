"""The per-epoch order plan: AutoOrder decides once, validates once on the order it chose, keeps."""

from __future__ import annotations

from collections.abc import Sequence

from headrace.pipeline import Step, step
from headrace.pipeline.runner import StepTiming
from headrace.planner.order import OrderPlan, plan_order
from headrace.profiler.report import PipelineProfile
from headrace.profiler.stats import Profiler


def ident_rng(x, rng):
    return x


def aug(name: str) -> Step:
    return step(ident_rng, name=name, random=True)


def profile(order: Sequence[Step], sizes: Sequence[int], reshaped: Sequence[bool],
            samples: int = 300) -> PipelineProfile:
    """A profile of ``order`` (load first): each sample's output bytes per step, and which
    steps changed its dtype or shape."""
    prof = Profiler(["load", *(s.name for s in order)])
    n = len(order) + 1
    for _ in range(samples):
        prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(n)], list(sizes),
                     reshapes=[False, *reshaped])
    return prof.report()


def run(declared: tuple[Step, ...], measured, epochs: int) -> list[OrderPlan]:
    """The plans of ``epochs`` epoch starts, each from the profile of the order run before it
    (as the loader does: a new order starts a new profile)."""
    plans: list[OrderPlan] = []
    current, prof, previous = declared, None, None
    for _ in range(epochs):
        plan = plan_order(declared, current, prof, "this run", True, previous=previous)
        plans.append(plan)
        previous, current = plan, plan.steps
        prof = measured(tuple(s.name for s in current))
    return plans


def names(plan: OrderPlan) -> list[str]:
    return [s.name for s in plan.steps]


def test_an_order_whose_factors_depend_on_it_changes_at_most_twice():
    # X changes the shape, P keeps it (so they may swap). Measured after P, X looks
    # deflationary (0.4); measured first, inflationary (2.5). Re-planned from the profile of
    # the order just run, the order flipped every epoch (and the output with it)
    p, x = aug("P"), aug("X")

    def measured(order: tuple[str, ...]) -> PipelineProfile:
        if order == ("P", "X"):
            return profile((p, x), [100, 100, 40], [False, True])
        return profile((x, p), [100, 250, 250], [True, False])

    plans = run((p, x), measured, 8)
    orders = [names(plan) for plan in plans]
    assert orders[:3] == [["P", "X"], ["X", "P"], ["P", "X"]]
    assert orders[3:] == [["P", "X"]] * 5
    assert plans[1].phase == "validating" and plans[2].phase == "kept"
    assert "as declared for the rest of the run" in plans[2].reason
    assert "did not hold on 300 samples profiled in it" in plans[2].reason
    assert "X: deflationary (0.40) -> inflationary (2.50)" in plans[2].reason


def test_an_order_rejected_earlier_is_not_run_again():
    # an earlier run's validation found X -> P did not hold (recorded with the stored
    # profile): decided again from that profile, it is not run for one epoch more
    p, x = aug("P"), aug("X")
    stored = profile((p, x), [100, 100, 40], [False, True])
    assert names(plan_order((p, x), (p, x), stored, "stored profile", True)) == ["X", "P"]
    plan = plan_order((p, x), (p, x), stored, "stored profile", True, rejected=[("X", "P")])
    assert names(plan) == ["P", "X"] and plan.phase == "kept"
    assert "order: as declared for the rest of the run: AutoOrder's order X -> P did not hold " \
        "when validated earlier" in plan.reason
    # another order is decided as before
    plan = plan_order((p, x), (p, x), stored, "stored profile", True, rejected=[("P", "X")])
    assert names(plan) == ["X", "P"] and plan.phase == "validating"


def test_an_order_that_holds_is_kept_whatever_later_profiles_say():
    p, x = aug("P"), aug("X")
    calls = []

    def measured(order: tuple[str, ...]) -> PipelineProfile:
        calls.append(order)
        if len(calls) <= 2:  # epoch 0 (declared), epoch 1 (reordered): X deflationary
            return profile(tuple({"P": p, "X": x}[n] for n in order),
                           [100, 100, 40] if order == ("P", "X") else [100, 40, 40],
                           [False, True] if order == ("P", "X") else [True, False])
        return profile((x, p), [100, 250, 250], [True, False])  # would say otherwise

    plans = run((p, x), measured, 6)
    assert [names(plan) for plan in plans] == [["P", "X"]] + [["X", "P"]] * 5
    assert [plan.phase for plan in plans] == ["undecided", "validating"] + ["kept"] * 4
    assert "validated on 300 samples profiled in this order" in plans[2].reason


def test_validation_waits_for_enough_samples_in_the_chosen_order():
    p, x = aug("P"), aug("X")
    decided = plan_order((p, x), (p, x), profile((p, x), [100, 100, 40], [False, True]),
                         "stored profile", True)
    assert names(decided) == ["X", "P"] and decided.phase == "validating"
    few = profile((x, p), [100, 40, 40], [True, False], samples=20)
    waiting = plan_order((p, x), decided.steps, few, "this run", True, previous=decided)
    assert waiting.steps == decided.steps and waiting.phase == "validating"
    assert "validated once 300 samples are profiled in this order (20 were" in waiting.reason
    enough = profile((x, p), [100, 40, 40], [True, False])
    kept = plan_order((p, x), decided.steps, enough, "this run", True, previous=waiting)
    assert kept.steps == decided.steps and kept.phase == "kept"


def test_a_decision_to_keep_the_running_order_is_made_again_with_a_later_profile():
    # a profile stored before the shapes were recorded reads no step as keeping its shape: its
    # decision kept the declared order, "validating" it, and the live profile's reorder then
    # "did not hold": the declared order for the whole run
    noise, crop = aug("noise"), aug("crop")
    old = Profiler(["load", "noise", "crop"])
    for _ in range(300):  # no reshapes flags: not recorded
        old.observe([StepTiming(i, 1e-3, 1e-3) for i in range(3)], [400, 400, 100])
    first = plan_order((noise, crop), (noise, crop), old.report(), "stored profile", True)
    assert names(first) == ["noise", "crop"] and first.phase == "undecided"
    live = profile((noise, crop), [400, 400, 100], [False, True])
    second = plan_order((noise, crop), first.steps, live, "this run", True, previous=first)
    assert names(second) == ["crop", "noise"] and second.phase == "validating"


def test_a_step_measured_by_its_times_alone_is_not_known_to_keep_its_shape():
    prof = Profiler(["load", "noise"])
    for _ in range(5):
        prof.observe([StepTiming(i, 1e-3, 1e-3) for i in range(2)], None)
    st = prof.report().step("noise")
    assert st.count == 5 and st.sized == 0 and not st.keeps_shape


def test_an_order_a_sample_broke_goes_back_to_the_declared_order_in_any_phase():
    # a sample on which a moved step changed the shape after all (pipeline/order_guard.py):
    # validating or already kept, the declared order runs for the rest of the run
    p, x = aug("P"), aug("X")
    moved = profile((x, p), [100, 40, 40], [True, False])
    for phase in ("validating", "kept"):
        previous = OrderPlan((x, p), None, "order: reordered by AutoOrder", phase)
        plan = plan_order((p, x), (x, p), moved, "this run", True, previous=previous,
                          broke="P changed a sample's dtype or shape")
        assert names(plan) == ["P", "X"] and plan.phase == "kept" and plan.decision is None
        assert "did not hold: P changed a sample's dtype or shape" in plan.reason
    # running the declared order, there is nothing to go back from
    previous = OrderPlan((p, x), None, "order: as declared", "undecided")
    plan = plan_order((p, x), (p, x), moved, "this run", True, previous=previous, broke="P ...")
    assert plan.decision is not None and "did not hold" not in plan.reason
