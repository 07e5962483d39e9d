"""What ``explain()`` says of a loader's sample cache (its ``CacheSession``), in lines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from headrace.cache.config import redact
from headrace.planner.cache_partition import INF
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
    if self.config.split is not None:
        why = " (Cache.split)"
    elif self.plan is not None:
        gpu = ("unlimited (not measured yet)" if self.plan_t_gpu == INF else
               f"{self.plan_t_gpu:.0f} samples/s, "
               + ("Cache.t_gpu" if self.config.t_gpu is not None else
                  "the training loop's own rate last epoch"))
        why = (f" (MDP, Seneca Eq. 1-9: {self.plan[0].predicted:.0f} samples/s predicted; "
               f"accelerator T_GPU {gpu})")
    else:
        why = " (default until profiled: the most processed exact form)"
    out.append(f"  split: {split}{why}")
    if self.plan is not None:
        out.append("  single-form splits: " + "; ".join(s.describe() for s in self.plan[1]))
    for e, pred in zip(epochs, self.predicted, strict=False):
        if pred is not None and e.finished:
            out.append(f"  epoch {e.epoch}: measured {e.samples_per_s:.0f} samples/s, "
                       f"MDP predicted {pred:.0f}")
    if opaque:
        out.append("  a Dataset (not a Pipeline): only __getitem__'s output can be cached, "
                   "as its steps run inside it, and it is exact only "
                   "within one (base seed, epoch); Cache(shared_augmented=True) reuses it across "
                   "epochs")
    out.extend(_ods_lines(self))
    aug = self.layout.get("augmented")
    if aug is not None and aug.shared:
        out.append("  shared_augmented: an augmented sample cached by another epoch or job is "
                   "served in place of computing it: its content then depends on what that "
                   "epoch or job drew (Seneca's trade), not only on this loader's seed")
    for n, c in zip(self.epoch_numbers[-3:], self.closed_epochs[-3:], strict=True):
        tiers = ", ".join(f"{k} {v}" for k, v in c.hits_by_tier.items())
        out.append(f"  epoch {n}: "
                   f"{c.hits} hits of {c.lookups} lookups ({100 * c.hit_rate:.0f}%: {tiers}), "
                   + (f"{c.not_worth} not looked up (dearer than the steps they save), "
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
