"""Streaming estimators with bounded memory: running moments and a reservoir of quantiles.

The profiler (``profiler/stats.py``) keeps one of each per step and quantity (wall and CPU
seconds, bytes); both merge, so per-worker or per-epoch estimates combine without the samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import numpy as np


class Moments:
    """Exact count, mean, variance (Welford), min and max of a stream of floats."""

    __slots__ = ("_m2", "count", "max", "mean", "min")

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, x: float) -> None:
        self.count += 1
        d = x - self.mean
        self.mean += d / self.count
        self._m2 += d * (x - self.mean)
        if x < self.min:
            self.min = x
        if x > self.max:
            self.max = x

    def add_many(self, xs: np.ndarray) -> None:
        """Add a batch of values (one numpy pass instead of a Python loop)."""
        if len(xs) == 0:
            return
        mean = float(xs.mean())
        self._combine(
            len(xs), mean, float(((xs - mean) ** 2).sum()), float(xs.min()), float(xs.max())
        )

    def merge(self, other: Moments) -> None:
        """Fold ``other`` into this one (Chan et al. parallel update)."""
        if other.count:
            self._combine(other.count, other.mean, other._m2, other.min, other.max)

    def _combine(self, n2: int, mean2: float, m2: float, lo: float, hi: float) -> None:
        n = self.count + n2
        d = mean2 - self.mean
        self._m2 += m2 + d * d * self.count * n2 / n
        self.mean += d * n2 / n
        self.count = n
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)

    @property
    def std(self) -> float:
        """Population standard deviation (0 for fewer than two values)."""
        return math.sqrt(self._m2 / self.count) if self.count > 1 else 0.0


class Quantiles:
    """Quantile estimator over a stream: a fixed-size uniform reservoir plus exact moments.

    The reservoir holds a uniform random sample of at most ``capacity`` values (Vitter's
    Algorithm R: value number ``n`` replaces a random slot with probability ``capacity / n``).
    Count, mean, std, min and max are exact; quantiles are exact until ``capacity`` values have
    been seen, then estimated from the reservoir (rank error about ``1/sqrt(capacity)``, about
    2% for 2048). ``add`` costs about 0.6 µs, ``add_many`` about 0.2 µs per value in
    batches of 256. Deterministic for a given ``seed``.
    """

    __slots__ = ("_buf", "_rand", "_rng", "capacity", "moments")

    def __init__(self, capacity: int = 2048, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"Quantiles capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.moments = Moments()
        self._buf = np.empty(capacity, dtype=np.float64)
        self._rand = random.Random(seed)  # scalar draws: far cheaper than numpy's per call
        self._rng: np.random.Generator | None = None  # batch draws, created on first use

    @property
    def count(self) -> int:
        return self.moments.count

    @property
    def mean(self) -> float:
        return self.moments.mean

    @property
    def std(self) -> float:
        return self.moments.std

    @property
    def min(self) -> float:
        return self.moments.min

    @property
    def max(self) -> float:
        return self.moments.max

    def add(self, x: float) -> None:
        """Add one value (non-finite values are ignored)."""
        if not math.isfinite(x):
            return
        self.moments.add(x)
        n, k = self.moments.count, self.capacity
        if n <= k:
            self._buf[n - 1] = x
        else:
            j = int(self._rand.random() * n)
            if j < k:
                self._buf[j] = x

    def add_many(self, xs: np.ndarray) -> None:
        """Add a batch of values (non-finite ones are ignored); same result law as ``add``."""
        xs = np.asarray(xs, dtype=np.float64)
        xs = xs[np.isfinite(xs)]
        if len(xs) == 0:
            return
        start, k = self.count, self.capacity
        self.moments.add_many(xs)
        fill = max(0, min(k - start, len(xs)))
        self._buf[start : start + fill] = xs[:fill]
        rest = xs[fill:]
        if len(rest) == 0:
            return
        rng = self._generator()
        counts = np.arange(start + fill + 1, start + len(xs) + 1, dtype=np.float64)
        slots = np.floor(rng.random(len(rest)) * counts).astype(np.int64)
        kept = slots < k
        slots, vals = slots[kept][::-1], rest[kept][::-1]
        _, last = np.unique(slots, return_index=True)  # sequential law: the latest value wins
        self._buf[slots[last]] = vals[last]

    def merge(self, other: Quantiles) -> None:
        """Fold ``other`` in; the reservoir stays a uniform sample of the union of both streams."""
        if other.count == 0:
            return
        n1, n2, k = self.count, other.count, self.capacity
        mine, theirs = self._values(), other._values()
        if len(mine) + len(theirs) <= k:
            merged = np.concatenate([mine, theirs])
        else:
            rng = self._generator()
            if n1 + n2 < 10**9:  # numpy's hypergeometric limit
                take1 = int(rng.hypergeometric(n1, n2, k))
            else:
                take1 = int(rng.binomial(k, n1 / (n1 + n2)))
            take1 = min(take1, len(mine))
            take2 = min(k - take1, len(theirs))
            merged = np.concatenate(
                [rng.choice(mine, take1, replace=False), rng.choice(theirs, take2, replace=False)]
            )
        self.moments.merge(other.moments)
        self._buf[: len(merged)] = merged

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (0 <= q <= 1), linear interpolation; NaN when empty."""
        return self.quantiles([q])[0]

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Several quantiles at once (one sort); NaN each when empty."""
        vals = self._values()
        if len(vals) == 0:
            return [math.nan] * len(qs)
        out = np.quantile(vals, np.clip(np.asarray(qs, dtype=np.float64), 0.0, 1.0))
        res = [float(v) for v in out]
        for i, q in enumerate(qs):  # the extremes are known exactly
            if q <= 0.0:
                res[i] = self.min
            elif q >= 1.0:
                res[i] = self.max
        return res

    def _generator(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng(self._rand.getrandbits(64))
        return self._rng

    def _values(self) -> np.ndarray:
        return self._buf[: min(self.count, self.capacity)]
