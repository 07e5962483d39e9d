"""Seneca's opportunistic data sampling (ODS, §5.2): which sample fills a position (pure).

One job's state for one epoch, no processes and no server: the shared cache's answer comes in
as plain data (``Answer``), so the policy is unit-tested on synthetic answers.

For each sampler position, in order, the job delivers one sample it has not *seen* (delivered
or dispatched) this epoch:

1. the requested index, when it is unseen and the shared cache holds it (a hit);
2. else an unseen cached index (a *substitute*; ``Answer.candidates``, drawn at random by the
   server); the requested index, if unseen, stays unseen and is *deferred*;
3. else (no unseen hit) the requested index when unseen (a miss), or else a deferred one.

Why every index comes exactly once: each position delivers one unseen index and marks it seen.
Let R be the sampler's positions still to come and U the unseen indices. When the sampler's
indices are exactly ``range(n)`` once each (``eligible``), |R| = |U| at every step, so the
indices of R already seen (substituted in early) are as many as the unseen ones no longer in R
(deferred): rule 3 always finds a deferred index, and at the end U is empty. Resuming starts
from the delivered set as seen, with the delivered indices' positions skipped: R = U again.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence

from headrace.runtime.bitmap import Bitmap


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the shared cache said about one request.

    Attributes:
        hits: per requested index, whether the shared cache holds it in a tier this job
            looks up.
        candidates: indices cached in such a tier that this job had not seen when it asked
            (random order); may include indices it has seen since (the policy checks its own
            seen bits).
        jobs: live jobs sharing the cache (registered and not expired), this one included.
    """

    hits: Sequence[bool]
    candidates: Sequence[int] = ()
    jobs: int = 1


NO_ANSWER = Answer(())
"""The cache could not be asked (server down): every request is treated as a miss."""


class Substitution:
    """One job's ODS state for one epoch.

    ``seen``: indices delivered before (a resumed epoch) or dispatched in this one; it grows
    by one bit per index (the only per-sample state). ``deferred``: misses replaced by a hit,
    to be delivered when the sampler asks for an index already seen.
    """

    def __init__(self, seen: Bitmap | None = None) -> None:
        self.seen = seen if seen is not None else Bitmap()
        self.deferred: deque[int] = deque()
        self.hits = 0
        """Positions filled by the requested index, found cached (rule 1)."""
        self.substituted = 0
        """Positions filled by a cached index other than the requested one (rule 2)."""
        self.from_deferred = 0
        """Positions filled by a deferred miss (rule 3, requested index already seen)."""

    def fill(self, requested: Sequence[int], answer: Answer) -> list[int]:
        """The indices to deliver at the positions that asked for ``requested`` (same length),
        marked seen. ``answer.hits`` may be empty (no answer: all misses)."""
        cands = deque(answer.candidates)
        out = []
        for k, i in enumerate(requested):
            unseen = i not in self.seen
            if unseen and k < len(answer.hits) and answer.hits[k]:
                self.hits += 1
                chosen = i
            elif (sub := self._candidate(cands)) is not None:
                self.substituted += 1
                chosen = sub
                if unseen:
                    self.deferred.append(i)
            elif unseen:
                chosen = i
            else:
                chosen = self._deferred()
                self.from_deferred += 1
            self.seen.set(chosen)
            out.append(chosen)
        return out

    def _candidate(self, cands: deque[int]) -> int | None:
        while cands:
            c = cands.popleft()
            if c not in self.seen:
                return c
        return None

    def _deferred(self) -> int:
        while self.deferred:
            d = self.deferred.popleft()
            if d not in self.seen:  # a deferred index may have come since as a substitute
                return d
        raise RuntimeError(
            "ODS found no unseen sample for a position: the sampler yielded an index twice or "
            "an index outside range(len(dataset)) (ODS needs each index exactly once per epoch)")


def eligible(sampler: object, user_batch_sampler: bool, drop_last: bool, batch_size: int | None,
             n: int) -> str | None:
    """Why ODS cannot run with this sampler (``None``: it can).

    Substitution delivers any unseen index of ``range(n)``, so the sampler must yield exactly
    those, once each: torch's ``RandomSampler`` without replacement over the whole dataset or a
    ``SequentialSampler``, without a dropped tail. A ``DistributedSampler`` shard, a subset or
    a weighted sampler would receive samples from outside its share.
    """
    from torch.utils.data import RandomSampler, SequentialSampler

    if user_batch_sampler:
        return "a user batch_sampler (its indices are unknown ahead)"
    if isinstance(sampler, RandomSampler):
        if sampler.replacement or sampler.num_samples != n:
            return "RandomSampler with replacement or num_samples != len(dataset)"
    elif not isinstance(sampler, SequentialSampler):
        return f"sampler {type(sampler).__name__} (ODS needs each index of the dataset once)"
    if drop_last and batch_size and n % batch_size:
        return "drop_last drops a tail (ODS could deliver a dropped sample in its place)"
    return None
