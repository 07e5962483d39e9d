"""The remote lines of ``explain()`` (planner/explain.py), from plain facts."""

import math

from headrace.planner.explain import RemoteFacts, remote_lines
from headrace.planner.offload import OffloadInputs, StepCost, decide


def facts(**kw):
    base = dict(address="auto", error=None, max_workers=4, remote_workers=2, local_workers=1,
                remote_samples=30, lost=0, split=None, steps=("load", "decode", "augment"),
                offload=None, autoplace=False, moves=(), measured_thp=50.0, cost_per_hour=None)
    base.update(kw)
    return RemoteFacts(**base)


def test_counts_and_measured_throughput():
    text = "\n".join(remote_lines(facts(lost=1, handed_off=3), 100))
    assert "3 handed off by remote workers over the timeout" in text
    assert "2 remote worker(s) now (at most 4), 1 local" in text
    assert "30 of 100 samples finished remotely" in text
    assert "1 remote worker(s) lost" in text
    assert "measured 50.0 samples/s" in text


def test_offload_decision_split_prediction_and_cost():
    d = decide(OffloadInputs(gthp=math.inf, lthp=20.0, remote_workers=4, bandwidth=1e9,
                             steps=(StepCost("load", 0.001, 1e4), StepCost("decode", 0.05, 1e5),
                                    StepCost("augment", 0.01, 1e5))))
    text = "\n".join(remote_lines(facts(offload=d, split=2, cost_per_hour=3.0), 100))
    assert "offload: yes" in text and "ratio" in text and "Lower" in text
    assert "remote workers run load -> decode, local workers augment" in text
    assert f"predicted {d.predicted:.1f} samples/s, measured 50.0" in text
    assert "cost: 3.00 per hour" in text and "per million samples" in text


def test_autoplace_moves_and_unreachable_cluster():
    text = "\n".join(remote_lines(facts(autoplace=True, moves=(
        (3.0, 0, 1, 0.25, "batch time still improving: add a remote worker"),)), 0))
    assert "AutoPlacement (Pecan): 1 move(s)" in text and "remote +1" in text
    text = "\n".join(remote_lines(facts(error="could not join 'x:1'"), 0))
    assert text.startswith("remote: not used (could not join 'x:1'")


def test_replans_and_link_measure():
    text = "\n".join(remote_lines(facts(watching=True), 0))
    assert "offloading watched" in text and "not yet" in text
    text = "\n".join(remote_lines(facts(
        watching=True, link="link measured: 900 MB/s, round trip 0.40 ms",
        replans=((12.5, "cluster changed (capacity joined): 0 -> 2 remote workers",
                  "offload: yes (no accelerator bound known); ratio 0.80", 2),)), 0))
    assert "link measured: 900 MB/s" in text
    assert "offloading decided again 1 time(s) at run time" in text
    assert "at 12.5 s: cluster changed (capacity joined): 0 -> 2 remote workers -> offload: yes" \
        in text and "2 remote worker(s)" in text
    assert "not yet" not in text


def test_between_epochs_the_counts_are_those_the_next_epoch_starts_with():
    # after an epoch without persistent workers (its pool closed) it said "0 local"
    import headrace as hr
    from headrace.remote.session import RemoteSession

    session = RemoteSession(hr.Remote(max_workers=3))
    session.available, session.max_workers, session.target = True, 3, 3  # joined (no cluster)
    session.local_started = 2  # what the last epoch's pool started with (attach)
    # none ever placed (no node with room): said "3 remote worker(s) now" all the same
    text = "\n".join(remote_lines(session.facts(None, ["load", "a"], 10.0), 0))
    assert "0 remote worker(s) now (at most 3), 2 local" in text
    assert "3 asked for, none placed yet" in text
    session.placed_total = 3  # the last epoch's were placed
    f = session.facts(None, ["load", "a"], 10.0)
    assert (f.remote_workers, f.local_workers) == (3, 2)
    text = "\n".join(remote_lines(f, 0))
    assert "3 remote worker(s) now (at most 3), 2 local" in text and "placed" not in text


def test_near_storage_hand_backs_are_no_offloaded_share():
    # a fetcher's sample back at its own stop counted as offloaded: "finished remotely"
    from headrace.remote.counts import AT_SPLIT, HANDED_BACK, HANDED_OFF, OFFLOADED, outcome

    partial = ("partial", 7, 3, None, [], 0, None, None)
    assert outcome(partial, 3) == AT_SPLIT  # at a split: its remote part is done
    assert outcome(partial, 3, per_sample=True) == HANDED_BACK
    assert outcome(partial, 4, per_sample=True) == outcome(partial, 4) == HANDED_OFF
    assert outcome(("done", 7, None, [], 0, None), 3, per_sample=True) == OFFLOADED
    text = "\n".join(remote_lines(facts(remote_samples=0, handed_back=40), 48))
    assert "0 of 48 samples finished remotely; 40 handed back at their own stop" in text


def test_the_split_names_load_as_this_hosts_when_it_reads_the_source():
    # the decision said "steps [1, 3) remote (this host reads the source)" while the split
    # line said "remote workers run load -> decode -> augment"
    d = decide(OffloadInputs(gthp=math.inf, lthp=20.0, remote_workers=4, bandwidth=1e9,
                             read_source=False,
                             steps=(StepCost("load", 0.001, 1e4), StepCost("decode", 0.05, 1e5),
                                    StepCost("augment", 0.01, 1e5), StepCost("pack", 0.0, 1e5))))
    assert d.offload and (d.best.start, d.best.stop) == (1, 3)
    text = "\n".join(remote_lines(facts(offload=d, split=3, read_local=True,
                                        steps=("load", "decode", "augment", "pack")), 100))
    assert "split: this host runs load, remote workers run decode -> augment, local workers " \
        "pack" in text
    # from the session as it applied the decision
    import headrace as hr
    from headrace.remote.session import RemoteSession

    session = RemoteSession(hr.Remote(max_workers=4, read_source=False))
    session.max_workers = 4
    session.apply_offload(d, None, available=4)
    f = session.facts(None, ["load", "decode", "augment", "pack"], None)
    assert f.read_local and "this host runs load, remote workers run decode" in \
        "\n".join(remote_lines(f, 0))
