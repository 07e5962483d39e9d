"""What ``explain()`` says of a loader's sample cache (its ``CacheSession``), in lines."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from headrace.cache.config import redact
from headrace.planner.cache_partition import INF, SWITCH_GAIN, Split
from headrace.telemetry.stats import EpochStats

if TYPE_CHECKING:
    from headrace.cache.session import CacheSession


def explain_lines(self: CacheSession, opaque: bool,
                  epochs: Sequence[EpochStats] = ()) -> list[str]:
    """The cache's lines of ``explain()``: where and how large, its forms and split and why,
    the last epochs' counts (``self``: the loader's ``CacheSession``)."""
    from headrace import units

    shards = len(getattr(self.backend, "shards", ())) if self.backend is not None else 0
    split_in = f" in {shards} shards" if shards > 1 else ""
    where = (f"memory (LMDB on /dev/shm{split_in}, shared by this job's workers)"
             if self.config.url == "memory" else f"{redact(self.config.url)} (shared; raw entries)")
    out = [f"cache: {where}, budget {units.size(self.budget)}"]
    if self.limits is not None:
        from headrace.cache import redis_limits

        out += redis_limits.explain_lines(self.limits, self.fitted)
    if self.layout is None:
        return [*out, "  forms: decided when the first epoch starts"]
    forms = ", ".join(f"{t.name} after step {t.position}"
                      + (" (per base seed and epoch)" if t.seeded and not t.shared else "")
                      for t in self.layout.tiers)
    out.append(f"  forms: {forms or 'none'}")
    out.extend(f"  {note}" for note in self.layout.notes)
    split = ", ".join(f"{k} {100 * v:.0f}%" for k, v in self.split.items()) or "nothing"
    if self.budget <= 0:
        why = " (no budget: nothing is cached, every sample runs its steps)"
    elif self.config.split is not None:
        why = " (Cache.split)"
    elif self.plan is not None:
        gpu = ("unlimited (not measured yet)" if self.plan_t_gpu == INF else
               f"{self.plan_t_gpu:.0f} samples/s, "
               + ("Cache.t_gpu" if self.config.t_gpu is not None else
                  "the training loop's own rate last epoch"))
        why = (f" (MDP, Seneca Eq. 1-9: {self.plan[0].predicted:.0f} samples/s predicted"
               f"{_kept(self.plan[0], self.plan_best)}; "
               f"accelerator T_GPU {gpu}; cache bandwidth B_cache "
               f"{units.size(self.plan_b_cache)}/s, {self.b_cache_how})")
    elif self.plan_off is not None:
        why = f" (default: {self.plan_off})"
    else:
        why = " (default until profiled: the most processed exact form)"
    out.append(f"  split: {split}{why}")
    if self.plan is not None:
        out.append("  single-form splits: " + "; ".join(s.describe() for s in self.plan[1]))
    out.extend(_prediction_lines(epochs, self.predicted))
    aug = self.layout.get("augmented")
    shared = aug is not None and aug.shared
    if opaque:  # (the advice to share only where it is not: the line below says it is)
        out.append("  a Dataset (not a Pipeline): only __getitem__'s output can be cached, "
                   "as its steps run inside it, and it is exact only within one (base seed, "
                   "epoch)" + ("" if shared else "; Cache(shared_augmented=True) reuses it "
                                               "across epochs"))
    out.extend(_ods_lines(self))
    if shared:
        out.append("  shared_augmented: an augmented sample cached by another epoch or job is "
                   "served in place of computing it: its content then depends on what that "
                   "epoch or job drew (Seneca's trade), not only on this loader's seed")
    for n, c in zip(self.epoch_numbers[-3:], self.closed_epochs[-3:], strict=True):
        tiers = ", ".join(f"{k} {v}" for k, v in c.hits_by_tier.items())
        out.append(f"  epoch {n}: "
                   f"{c.hits} hits of {c.lookups} lookups ({100 * c.hit_rate:.0f}%: {tiers}), "
                   + (f"{c.not_worth} not looked up (dearer than what they would save), "
                      if c.not_worth else "")
                   + f"{c.inserts} stored, {c.full} not stored (budget full), {c.uncacheable} uncacheable, "
                   f"{c.errors} errors"
                   + (f", {c.not_stored} not worth storing (the steps they save take less "
                      "than 3 copies of them)" if c.not_stored else "")
                   + (f", {c.drew} not stored (a step drew from a global random generator: "
                      "declare it random=True to cache its output per epoch)"
                      if c.drew else "")
                   + (f", {c.substituted} substituted (ODS, {c.jobs} "
                      f"{'job' if c.jobs == 1 else 'jobs'})" if c.jobs else ""))
    out.extend(_check_lines(self))
    return out


def _check_lines(self: CacheSession) -> list[str]:
    """How many hits were computed again and compared with their form (the whole run), which
    forms matched and which differed (``cache/verify.py``)."""
    c = self.counters.totals()
    if not c["checked"]:
        return []
    from headrace.cache.verify import CHECKS_UNVERIFIED, CHECKS_VERIFIED, VERIFIED

    verified = [t.name for t in self.layout.tiers
                if self.counters.verdicts.state(t.name) == VERIFIED] if self.layout else []
    out = [f"  checked: {c['checked']} hits computed again and compared with their cached "
           f"form ({CHECKS_UNVERIFIED} a worker and epoch until a form matches, then "
           f"{CHECKS_VERIFIED}), {c['differed']} differed; "
           + (f"verified: {', '.join(verified)} (its steps gave equal values)" if verified
              else "none verified")]
    out.extend(f"  {line}" for _, line in differs_lines(self))
    return out


def differs_lines(self: CacheSession) -> list[tuple[str, str]]:
    """(tier, line) for each form found to differ from what its steps compute now."""
    from headrace.cache.tiers import TIERS
    from headrace.cache.verify import DIFFERS

    verdicts, names, out = self.counters.verdicts, self.step_names, []
    for tier in TIERS:
        if verdicts.state(tier) != DIFFERS:
            continue
        t = self.layout.get(tier) if self.layout is not None else None
        after = f" (after {names[t.position]})" if t is not None and t.position < len(names) else ""
        steps = verdicts.located(tier)
        if steps is not None and steps[1] < len(names):
            lo, hi = steps
            who = names[hi] if lo == hi else f"one of {', '.join(names[lo:hi + 1])}"
            fix = ("move the draw into a step declared random=True, drawing from the rng it is "
                   "given (a source's load is given none)" if hi == 0 and len(names) > 1
                   else "declare it random=True and draw from the rng it is given")
            why = (f"{who} gives another output for the same input and seed in each run: it "
                   "draws from a generator headrace does not see (another module's, one it "
                   "makes itself, such as np.random.default_rng() or torch.Generator().seed()); "
                   f"fix: {fix}")
        else:
            why = ("two more runs of its steps agree with each other, so what they read "
                   "differs from when the form was stored (a global or a file the script "
                   "changed since, in this job or in the one that stored the entry); if a step "
                   "draws from a generator of its own, declare it random=True and draw from "
                   "the rng it is given")
        where = verdicts.where(tier)
        at = f" ({where})" if where else ""
        out.append((tier, f"the {tier} form{after} differed from what its steps compute now "
                    f"(a hit computed again){at}: {why}. The {tier} form is neither served nor "
                    "stored for the rest of this run; the computed samples were delivered"))
    return out


def _ods_lines(self: CacheSession) -> list[str]:
    if not self.config.ods:
        return []
    if self.ods_off is not None:
        return [f"  ODS: off: {self.ods_off}"]
    aug = self.layout.get("augmented") if self.layout is not None else None
    lines = [f"  ODS (Seneca 5.2): on, job {self.job!r}: a sample the shared cache lacks is "
             "replaced by a cached one this job has not seen this epoch (the missed one "
             "comes later; each sample still once per epoch); an entry is evicted once every "
             "live job used it. Which sample fills a position, so batch composition, "
             "depends on what the other jobs cached"]
    if aug is not None and aug.shared:
        lines.append("  ODS with shared_augmented: augmented samples made by other jobs "
                     "are served, so a sample's content depends on the other jobs' seeds")
    return lines


PREDICTIONS_SHOWN = 3
"""Epochs whose measured rate and MDP's prediction ``explain()`` lists, the latest; a line
before them sums up the others (a 300-epoch job printed 300 such lines: a hunt)."""


def _prediction_lines(epochs: Sequence[EpochStats], predicted: Sequence[float | None]) -> list[str]:
    """``epoch k: measured X samples/s, MDP predicted Y`` for the latest planned epochs, and
    the median and range of measured ÷ predicted over the earlier ones."""
    pairs = [(e, p) for e, p in zip(epochs, predicted, strict=False)
             if p is not None and e.finished]
    out = []
    earlier = pairs[:-PREDICTIONS_SHOWN]
    if earlier:
        ratios = sorted(e.samples_per_s / p for e, p in earlier if p > 0)
        if ratios:
            out.append(f"  epochs {earlier[0][0].epoch}-{earlier[-1][0].epoch}: measured ÷ MDP "
                       f"predicted {ratios[len(ratios) // 2]:.2f} median "
                       f"({ratios[0]:.2f}-{ratios[-1]:.2f})")
    for e, p in pairs[-PREDICTIONS_SHOWN:]:
        out.append(f"  epoch {e.epoch}: measured {e.samples_per_s:.0f} samples/s, "
                   f"MDP predicted {p:.0f}")
    return out


def _kept(plan: Split, best: Split | None) -> str:
    """``; kept from the last epoch: ...``: where the epoch kept the last split (``plan``)
    over MDP's ``best`` (None: it did not), and the best's predicted gain, rounded down."""
    if best is None:
        return ""
    gain = best.predicted / plan.predicted - 1 if 0 < plan.predicted < INF else 0.0
    return (f"; kept from the last epoch: the best split, {best.describe()}, is "
            f"{math.floor(1000 * gain + 1e-6) / 10:.1f}% faster, within the {SWITCH_GAIN:.0%} "
            "a switch must gain to pay for the entries it drops")
