import pytest

import headrace.planner.workers as workers_mod
from headrace.planner.workers import (
    AutoscaleConfig,
    WorkerScaler,
    consumer_rate,
    demand_workers,
    formula_delta,
    next_worker_count,
)

CFG = AutoscaleConfig(min_workers=1, max_workers=16, alpha=2.0, beta=2.0, cpu_threshold=0.7)


def test_empty_queue_and_busy_cpu_add_workers_clipped_to_two():
    d = next_worker_count(4, queue_fill=0.0, cpu_usage=1.0, cfg=CFG)
    assert formula_delta(0.0, 1.0, CFG) == pytest.approx(2.6)
    assert d.new == 6  # +2.6 clipped to +2


def test_full_queue_and_idle_cpu_remove_workers():
    d = next_worker_count(8, queue_fill=1.0, cpu_usage=0.0, cfg=CFG)
    assert d.delta == pytest.approx(-1.4)
    assert d.new == 7


def test_balanced_state_keeps_count():
    d = next_worker_count(5, queue_fill=0.65, cpu_usage=0.7, cfg=CFG)  # Δ = 0.7 -> +1
    assert d.new == 6
    d = next_worker_count(5, queue_fill=0.9, cpu_usage=0.7, cfg=CFG)  # Δ = 0.2 -> 0
    assert d.new == 5


def test_bounds_and_memory_cap():
    assert next_worker_count(16, 0.0, 1.0, CFG).new == 16
    assert next_worker_count(1, 1.0, 0.0, CFG).new == 1
    d = next_worker_count(4, 0.0, 1.0, CFG, memory_cap=5)
    assert d.new == 5 and "memory allows 5" in d.describe()


def test_scaler_uses_moving_average_and_memory_budget():
    s = WorkerScaler(AutoscaleConfig(max_workers=16, ema=0.5))
    for fill in (1.0, 1.0, 0.0):
        s.observe_queue(fill)
    assert s.queue_avg == pytest.approx(0.5)
    d = s.decide(4, cpu_usage=0.7, memory_per_worker=100.0, memory_budget=450.0)
    assert d.memory_cap == 4
    assert d.new == 4  # formula says +1, memory says at most 4


def test_config_validation():
    with pytest.raises(ValueError):
        AutoscaleConfig(min_workers=0)
    with pytest.raises(ValueError):
        AutoscaleConfig(min_workers=4, max_workers=2)


def test_default_upper_bound_follows_the_cpu_share_of_samples(monkeypatch):
    import headrace.planner.workers as workers

    monkeypatch.setattr(workers, "available_cpus", lambda: 2)
    auto = AutoscaleConfig()
    assert auto.bounds() == (1, 4)  # nothing measured yet: 2 x cores
    assert auto.bounds(cpu_share=0.9) == (1, 4)  # CPU-bound samples: no more than that
    assert auto.bounds(cpu_share=0.1) == (1, 20)  # samples mostly wait: cores / share
    assert auto.bounds(cpu_share=0.001) == (1, 2 * workers.AUTO_MAX_WORKERS_PER_CORE)  # capped
    assert auto.slot_bound() == 2 * workers.AUTO_MAX_WORKERS_PER_CORE
    assert AutoscaleConfig(max_workers=6).bounds(cpu_share=0.01) == (1, 6)  # the user's max wins
    # an empty queue with idle CPU keeps adding workers past 2 x cores when samples mostly wait
    assert next_worker_count(4, 0.0, 0.3, auto).new == 4
    assert next_worker_count(4, 0.0, 0.3, auto, cpu_share=0.05).new == 5


def test_saturated_cores_add_no_worker_beyond_them():
    # the paper's case (no cores given) adds; with 2 cores saturated, 4 workers stay 4
    assert next_worker_count(4, 0.0, 1.0, CFG).new == 6
    d = next_worker_count(4, 0.0, 1.0, CFG, cores=2)
    assert d.new == 4 and d.saturated and "saturated" in d.describe()
    # below the cores, adding up to them is still allowed
    assert next_worker_count(1, 0.0, 1.0, CFG, cores=2).new == 2
    # saturated cores never block removing workers
    assert next_worker_count(8, 1.0, 0.95, CFG, cores=2).new <= 8
    # below the saturation threshold the formula is untouched
    assert next_worker_count(4, 0.0, 0.85, CFG, cores=2).new == 6


def test_littles_law_jumps_to_the_workers_the_consumer_needs():
    from headrace.planner.workers import demand_workers

    # 200 samples/s taken, 0.1 s per sample in a worker: 20 busy workers, 25 with the margin
    assert demand_workers(200.0, 0.1, 1.25) == 25
    assert demand_workers(None, 0.1, 1.25) is None and demand_workers(10.0, 0.0, 1.0) is None
    big = AutoscaleConfig(max_workers=64)
    d = next_worker_count(2, 0.0, 0.3, big, cores=2, demand=25)
    assert d.new == 25 and "λ·W" in d.describe()  # one decision, not eleven steps of +2
    assert next_worker_count(2, 0.0, 0.3, CFG, cores=2, demand=25).new == 16  # bounds hold
    # a queue at least half full, or saturated cores, do not jump
    assert next_worker_count(2, 0.6, 0.3, big, cores=2, demand=25).new <= 4
    assert next_worker_count(2, 0.0, 0.95, big, cores=2, demand=25).new == 2
    # a demand below what the formula adds does not hold the formula back
    assert next_worker_count(4, 0.0, 0.8, big, cores=8, demand=3).new == 6
    # a known CPU share caps the jump at the workers the cores can run: CPU-bound samples
    # (0.97) on 2 cores get Formula 2's +1 and no jump to 5; samples that mostly wait (0.1)
    # still jump, to the 20 the cores can run
    assert next_worker_count(2, 0.0, 0.3, big, cores=2, demand=5).new == 5
    capped = next_worker_count(2, 0.0, 0.3, big, cores=2, demand=5, cpu_share=0.97)
    assert capped.new == 3 and capped.demand_workers == 5  # explain() still says what λ·W was
    assert next_worker_count(2, 0.0, 0.3, big, cores=2, demand=25, cpu_share=0.1).new == 20
    assert next_worker_count(2, 0.0, 0.3, big, cores=2, demand=25, cpu_share=0.05).new == 25


def test_scaler_passes_rate_and_wall_to_littles_law():
    s = WorkerScaler(AutoscaleConfig(max_workers=64, ema=1.0))
    s.observe_queue(0.0)
    d = s.decide(2, cpu_usage=0.2, cores=2, consumer_rate=100.0, sample_wall_s=0.2)
    assert d.demand_workers == 25 and d.new == 25


def test_start_count_from_a_stored_profiles_cpu_share(monkeypatch):
    """With a stored profile, a job whose samples mostly wait starts at the workers that keep
    the cores busy (cores / CPU share), within the bounds; CPU-bound samples start at the
    cores; an explicit ``initial`` wins."""
    import headrace.planner.workers as workers

    monkeypatch.setattr(workers, "available_cpus", lambda: 2)
    auto = AutoscaleConfig()
    assert auto.start_count() == 2  # nothing known: the cores
    assert auto.start_count(cpu_share=0.07) == 29  # speech-3s: 8.8 ms CPU of 125 ms
    assert auto.start_count(cpu_share=0.001) == 2 * workers.AUTO_MAX_WORKERS_PER_CORE
    # CPU-bound: the cores, not one more (imagenet's steps: share 0.97 measured alone)
    assert auto.start_count(cpu_share=0.97) == 2
    assert auto.start_count(cpu_share=0.6) == 3  # 3.33 workers' demand: 3
    assert auto.start_count(cpu_share=0.55) == 4  # 3.64: 4
    assert AutoscaleConfig(initial=5).start_count(cpu_share=0.07) == 5
    assert AutoscaleConfig(max_workers=8).start_count(cpu_share=0.07) == 8


def test_start_count_no_higher_than_the_stored_consumer_needs(monkeypatch):
    """With the consumer's rate from the stored run, auto starts at no more workers than
    Little's law gives for it: CPU-bound samples on 16 cores whose consumer 6 workers keep fed
    start at 6, not 16; a consumer that needs more than the cores can run still starts at the
    cores; ``initial`` wins over both."""
    import headrace.planner.workers as workers

    monkeypatch.setattr(workers, "available_cpus", lambda: 16)
    auto = AutoscaleConfig()
    assert auto.start_count(cpu_share=0.95) == 17  # 16.8: nearest
    assert auto.start_count(cpu_share=0.95, demand=6) == 6
    assert auto.start_count(cpu_share=0.95, demand=40) == 17
    assert auto.start_count(demand=6) == 6  # no share stored: the cores, capped by the need
    assert auto.start_count(cpu_share=0.07, demand=30) == 30  # mostly waiting: 229 → the need
    assert AutoscaleConfig(min_workers=8).start_count(cpu_share=0.95, demand=3) == 8
    assert AutoscaleConfig(initial=12).start_count(cpu_share=0.95, demand=3) == 12


def test_consumer_rate_needs_half_a_second_of_consumer_time():
    assert consumer_rate(640, 2.0) == 320.0
    assert consumer_rate(640, 0.4) is None  # too little measured
    assert consumer_rate(0, 5.0) is None
    # Little's law on it: 320 samples/s, 20 ms a sample, margin 1.25: 8 workers
    assert demand_workers(consumer_rate(640, 2.0), 0.02, 1.25) == 8


def test_a_draining_epoch_keeps_its_count():
    """Nothing left to hand out: a full queue and idle CPU at an epoch's end remove no
    worker (the next epoch starts from this count), nor does an empty queue add one."""
    assert next_worker_count(8, queue_fill=1.0, cpu_usage=0.0, cfg=CFG).new < 8
    d = next_worker_count(8, queue_fill=1.0, cpu_usage=0.0, cfg=CFG, draining=True)
    assert d.new == 8 and d.current == 8
    assert next_worker_count(8, 0.0, 1.0, CFG, draining=True).new == 8
    scaler = WorkerScaler(CFG)
    scaler.observe_queue(1.0)
    assert scaler.decide(8, 0.0, draining=True).new == 8


def test_busy_workers_rounds_to_the_nearest_count():
    """cores / share rounded to the nearest count, never 0."""
    assert workers_mod.busy_workers(2, 0.97) == 2
    assert workers_mod.busy_workers(2, 0.8) == 3  # 2.5: half up
    assert workers_mod.busy_workers(16, 0.5) == 32
    assert workers_mod.busy_workers(1, 1.0) == 1
    assert workers_mod.busy_workers(1, 3.0) == 1  # never 0


def test_the_memory_budget_follows_what_other_processes_take():
    from headrace.planner.ranks import worker_memory_budget

    gib = 2.0**30
    start = worker_memory_budget(16 * gib, 0.0, 1)  # before any worker: half the available
    assert start == 8 * gib
    # the workers took 4 GiB of the 16: the budget is unchanged
    assert worker_memory_budget(12 * gib, 4 * gib, 1) == start
    # another process took 8 GiB meanwhile: the budget drops, and with it the scaler's cap
    later = worker_memory_budget(4 * gib, 4 * gib, 1)
    assert later == 4 * gib
    s = WorkerScaler(AutoscaleConfig(max_workers=16))
    assert s.decide(8, cpu_usage=0.5, memory_per_worker=gib / 2, memory_budget=start).new >= 8
    assert s.decide(8, cpu_usage=0.5, memory_per_worker=gib / 2, memory_budget=later).new == 8
    assert s.decide(8, cpu_usage=0.5, memory_per_worker=gib, memory_budget=later).new == 4
    assert worker_memory_budget(16 * gib, 0.0, 4) == 2 * gib  # four ranks on the node


def test_no_decision_adds_workers_the_rest_of_the_epoch_cannot_keep_busy():
    """Each decision is capped, as a pool's start is, by the workers the epoch's unfinished
    samples keep busy (two a worker): an empty queue at a short epoch's end asked Little's law
    for 25 workers where 5 samples were left."""
    from headrace.planner.workers import epoch_workers

    assert epoch_workers(5, 64) == 3  # 5 samples left: 3 workers hold them
    assert epoch_workers(100, 16) == 8 and epoch_workers(None, 16) == 8  # the in-flight bound
    assert epoch_workers(0, 16) == 0
    big = AutoscaleConfig(max_workers=64)
    d = next_worker_count(2, 0.0, 0.3, big, cores=2, demand=25, epoch_cap=3)
    assert d.new == 3 and d.epoch_cap == 3
    assert "the rest of the epoch keeps 3 busy" in d.describe()
    assert next_worker_count(4, 0.0, 1.0, CFG, epoch_cap=5).new == 5  # Formula 2's +2 too
    # a cap that does not bind is not named
    free = next_worker_count(4, 0.0, 1.0, CFG, epoch_cap=20)
    assert free.new == 6 and free.epoch_cap is None and "epoch" not in free.describe()
    # it removes none (the next epoch starts from this count; its start has its own cap),
    # nor holds back what the formula removes
    assert next_worker_count(6, 0.0, 1.0, CFG, epoch_cap=2).new == 6
    assert next_worker_count(8, 1.0, 0.0, CFG, epoch_cap=2).new == 7
    assert next_worker_count(1, 0.0, 1.0, AutoscaleConfig(min_workers=4), epoch_cap=2).new == 4
    s = WorkerScaler(AutoscaleConfig(max_workers=64, ema=1.0))
    s.observe_queue(0.0)
    d = s.decide(2, cpu_usage=0.2, cores=2, consumer_rate=100.0, sample_wall_s=0.2, epoch_cap=4)
    assert d.demand_workers == 25 and d.new == 4


def test_the_rest_of_an_epoch_is_what_its_sampler_has_yet_to_give_and_what_runs():
    import itertools

    from headrace.runtime.lanes import Lanes
    from headrace.runtime.worker_scaling import epoch_cap
    from tests.unit.test_lanes import spec

    # the runtime reads it off the scheduler's lanes, capped by the in-flight bound
    lanes = Lanes(spec([[2 * k, 2 * k + 1] for k in range(8)], max_in_flight=100, total=16),
                  itertools.count())
    assert epoch_cap(lanes) == 8  # nothing pulled yet: 16 samples, 8 workers
    for _ in range(7):
        assert lanes.next_fresh(0) is not None
    lanes.settled = 4  # 8 pulled (one waits), 4 settled: 8 to give + 4 unsettled
    assert epoch_cap(lanes) == 6
    for _ in range(9):
        assert lanes.next_fresh(0) is not None
    lanes.settled = 11  # all 16 given, 5 left running or waiting
    assert epoch_cap(lanes) == 3
    small = Lanes(spec([[0, 1]], max_in_flight=4, total=400), itertools.count())
    assert epoch_cap(small) == 2  # 4 in flight at most: 2 workers
    # a sampler that gave more than its __len__ said: the rest is unknown, the bound caps
    over = Lanes(spec([[k] for k in range(12)], max_in_flight=8, total=4), itertools.count())
    for _ in range(6):
        assert over.next_fresh(0) is not None
    assert epoch_cap(over) == 4


def test_a_decision_names_what_held_its_count():
    """explain() shows the last decision: its line names what kept the count from Formula 2's
    step, and only what did (a hunt found "kept 8 ... Δ=+2.50" with no reason while the epoch
    drained, "kept 16" without the bound, and saturated cores named where Formula 2 itself
    rounded to 0)."""
    d = next_worker_count(8, 0.0, 0.95, CFG, draining=True)
    assert d.new == 8 and d.held == "draining" and "the epoch is draining" in d.describe()
    d = next_worker_count(16, 0.0, 0.95, CFG)
    assert d.new == 16 and d.held == "max_workers" and "at max_workers (16)" in d.describe()
    d = next_worker_count(15, 0.0, 0.95, CFG)  # +2 asked, +1 allowed
    assert d.new == 16 and "at max_workers (16)" in d.describe()
    d = next_worker_count(1, 1.0, 0.0, CFG)
    assert d.new == 1 and d.held == "min_workers" and "at min_workers (1)" in d.describe()
    # the memory cap: named when it held the count, whether it stopped additions or removed
    d = next_worker_count(8, 0.0, 0.8, CFG, memory_cap=4)
    assert d.new == 4 and d.held == "memory" and "memory allows 4" in d.describe()
    d = next_worker_count(4, 0.0, 0.8, CFG, memory_cap=12)
    assert d.new == 6 and d.held is None and "memory" not in d.describe()
    # saturated cores: named only when they changed the count
    d = next_worker_count(4, 1.0, 0.92, CFG, cores=16)  # Δ=+0.44 rounds to 0 anyway
    assert d.new == 4 and not d.saturated and d.held is None
    assert d.describe().endswith("Δ=+0.44")
    d = next_worker_count(4, 0.0, 0.95, CFG, cores=4)  # +2 asked, the 4 cores hold it
    assert d.new == 4 and d.saturated and "none added beyond the 4 cores" in d.describe()
    d = next_worker_count(16, 0.0, 0.95, CFG, cores=2)  # max_workers would have held it too
    assert d.new == 16 and not d.saturated and "at max_workers (16)" in d.describe()
    d = next_worker_count(4, 0.0, 0.95, CFG, cores=2, epoch_cap=2)  # so would the epoch
    assert d.new == 4 and not d.saturated and d.held == "epoch"
    d = next_worker_count(4, 0.0, 0.95, CFG, cores=2, epoch_cap=8)
    assert d.new == 4 and d.saturated and "beyond the 2 cores" in d.describe()
    # the epoch's cap, and the automatic upper bound (max_workers=None) named as such
    d = next_worker_count(4, 0.0, 1.0, CFG, epoch_cap=5)
    assert d.new == 5 and d.held == "epoch" and "keeps 5 busy" in d.describe()
    auto = AutoscaleConfig()
    hi = auto.bounds()[1]
    d = next_worker_count(hi, 0.0, 0.95, auto)
    assert d.new == hi and f"at the upper bound ({hi}: max_workers=None" in d.describe()
    # nothing held: no clause
    d = next_worker_count(4, 0.0, 1.0, CFG)
    assert d.new == 6 and d.held is None and d.describe().endswith("Δ=+2.60")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_reading_that_is_not_a_number_is_ignored(bad):
    """One NaN queue reading made the moving average NaN for good, read as an empty queue:
    a worker added at every decision. Ignored; a CPU reading that is not a number takes no
    decision (NaN read as an idle CPU and removed workers)."""
    s = WorkerScaler(AutoscaleConfig(max_workers=16, ema=0.5))
    s.observe_queue(1.0)
    s.observe_queue(bad)
    s.observe_queue(1.0)
    assert s.queue_avg == 1.0
    assert s.decide(8, cpu_usage=0.0).new == 7  # a full queue, idle CPU: Formula 2 removes one
    d = next_worker_count(8, 1.0, bad, CFG)
    assert d.new == 8 and d.held == "unmeasured" and "not a number" in d.describe()
    assert next_worker_count(8, bad, 0.7, CFG).new == 8
