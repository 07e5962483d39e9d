"""The learned hand-off timeout (MinatoLoader §4.2).

During warm-up no sample is handed off and every per-sample preprocessing time is recorded.
Then the timeout is the 75th percentile of those times: only the slowest quarter leaves the fast
lane. When clearly more samples go slow than that percentile implies (a skewed distribution or
drift: :func:`slow_share_limit`, a binomial test over the last ``window`` samples) the policy
falls back to the 90th percentile for one window. It keeps adapting: the percentile is
recomputed over a sliding window of recent samples every ``update_every`` samples. When clearly
fewer of the latest ``DRIFT_DOWN_RECORD`` samples reach the timeout than its percentile implies
(samples got faster: :func:`over_share_floor`), the window forgets the samples before them.

Pure: it is fed numbers and returns numbers; no clock, no processes.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections import deque
from collections.abc import Sequence
from itertools import islice

import numpy as np

HISTORY_KEPT = 10_000
"""Timeout changes kept in ``TimeoutPolicy.history``."""

FALLBACK_SD = 4.0
"""Standard deviations of chance by which the share of samples gone slow must exceed the share
the percentile in force implies before the fallback engages (:func:`slow_share_limit`). The
share is judged every ``update_every`` samples over overlapping records, a few hundred times in
20,000 samples: at 4 sd a steady trace spent under 1% of its samples under the fallback (the
old fixed 0.35 over 128 samples, 2.6 sd: 14-19%), and a 3x drift still engages it about 100
samples after it starts (``tests/unit/test_timeout_fallback.py``)."""

DRIFT_DOWN_RECORD = 128
"""Latest samples judged, every ``update_every`` samples, for a drift down: if clearly fewer of
them reach the timeout than its percentile implies (:func:`over_share_floor`: at p75 over a
1,024-sample window, 11 of 128 where 32 are expected), the window keeps only them, so the
timeout follows faster samples as promptly as the fallback follows slower ones (a 3x drift
down: 88-152 samples, where the window took 728-792 to turn over;
``tests/unit/test_timeout_drift_down.py``). Too few to judge a p90 timeout at ``FALLBACK_SD``
(its floor is below 0): during a fallback a drift down waits for the fallback to run out."""


@dataclasses.dataclass(frozen=True)
class TimeoutConfig:
    """Settings of the hand-off timeout.

    Attributes:
        warmup_samples: samples profiled before the first timeout is set (no hand-off before).
        percentile: percentile of per-sample time used as the timeout (paper: 75).
        fallback_percentile: percentile used when too many samples go slow (paper: 90).
        max_slow_fraction: share (0..1) of the last ``window`` classified samples gone slow
            above which the fallback engages. ``None`` (default): derived from the percentile
            in force, the share it implies (25% for p75, 10% for p90) plus ``FALLBACK_SD``
            binomial standard deviations of that many samples (:func:`slow_share_limit`); a
            number must exceed ``1 - percentile / 100``, which a steady trace reaches anyway.
        window: number of recent per-sample times the percentile is computed over.
        update_every: samples between two recomputations.
        fixed_s: a fixed timeout in seconds that disables learning (``None``: learn it).
    """

    warmup_samples: int = 64
    percentile: float = 75.0
    fallback_percentile: float = 90.0
    max_slow_fraction: float | None = None
    window: int = 1024
    update_every: int = 32
    fixed_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("warmup_samples", "window", "update_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise TypeError(f"TimeoutConfig({name}=...) takes an int (samples), got {value!r}")
        for name in ("percentile", "fallback_percentile", "max_slow_fraction", "fixed_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, numbers.Real)):
                raise TypeError(f"TimeoutConfig({name}=...) takes a number, got {value!r}")
        if not 0 < self.percentile < 100 or not 0 < self.fallback_percentile < 100:
            raise ValueError("percentiles must be in (0, 100)")
        if self.fallback_percentile < self.percentile:
            raise ValueError("fallback_percentile must be >= percentile")
        if self.warmup_samples < 1 or self.window < 8 or self.update_every < 1:
            raise ValueError("warmup_samples >= 1, window >= 8, update_every >= 1 required")
        msf = self.max_slow_fraction
        if msf is not None and not 1 - self.percentile / 100 < msf <= 1:
            raise ValueError(
                f"max_slow_fraction={msf:g} is not above the {100 - self.percentile:g}% of "
                f"samples that percentile={self.percentile:g} sends slow by design (and at most "
                "1): the p90 fallback would engage on a steady trace. Leave max_slow_fraction="
                "None to derive it from the percentile, or raise it"
            )


class TimeoutPolicy:
    """Learns the per-sample hand-off timeout from observed preprocessing times."""

    def __init__(self, config: TimeoutConfig | None = None) -> None:
        self.config = config or TimeoutConfig()
        c = self.config
        self._times: deque[float] = deque(maxlen=c.window)
        # _times as an array (oldest first) as of the last _recompute, which then adds the
        # _since_update samples appended since: converting a whole 1,024-sample deque took
        # more than half of observe's cost (``_window_array``). None: convert it whole.
        self._array: np.ndarray | None = None
        self._slow: deque[bool] = deque(maxlen=c.window)  # went slow, under _slow_pct
        self._slow_count = 0  # True entries of _slow
        self._slow_pct = c.percentile  # the percentile the flags in _slow were classified at
        self._seen = 0
        self._seeded = 0  # entries of _times that are a stored profile's quantiles, not samples
        self._since_update = 0
        self._fallback_until = -1
        self._timeout = c.fixed_s if c.fixed_s is not None else math.inf
        self._timeout_pct = math.nan  # the percentile _timeout was taken at
        self._typical = math.nan
        self.drifts_down = 0
        """Times the window was cut to its latest ``DRIFT_DOWN_RECORD`` samples because too few
        of them reached the timeout (samples got faster)."""
        self.history: deque[tuple[int, float, float]] = deque(maxlen=HISTORY_KEPT)
        """(samples seen, timeout in seconds, percentile used) at every change, the latest
        ``HISTORY_KEPT`` (a change every few dozen samples, for the loader's life)."""

    @property
    def timeout_s(self) -> float:
        """Current timeout in seconds; ``inf`` during warm-up (no hand-off)."""
        return self._timeout

    @property
    def typical_s(self) -> float:
        """Median seconds of a sample's steps over the recent window (``nan`` before the first
        ``warmup_samples``); refreshed with the timeout (also a fixed one), every
        ``update_every`` samples."""
        return self._typical

    @property
    def warming_up(self) -> bool:
        return self.config.fixed_s is None and self._seen < self.config.warmup_samples

    @property
    def using_fallback(self) -> bool:
        return self._seen < self._fallback_until

    @property
    def percentile_in_force(self) -> float:
        """The percentile the timeout is taken at now: ``fallback_percentile`` while the
        fallback holds, else ``percentile`` (``nan`` for a fixed timeout: none is)."""
        if self.config.fixed_s is not None:
            return math.nan
        return self.config.fallback_percentile if self.using_fallback else self.config.percentile

    @property
    def slow_fraction(self) -> float:
        """Share (0..1) of the last ``window`` classified samples that were handed off, since
        the percentile in force last changed."""
        return self._slow_count / len(self._slow) if self._slow else 0.0

    @property
    def window_samples(self) -> int:
        """Samples measured in this run that the window holds (the timeout's basis)."""
        return len(self._times) - self._seeded

    @property
    def window_stored(self) -> int:
        """Values of a stored profile's per-sample time quantiles still in the window: they
        are summary points of an earlier run, not samples, and leave it first."""
        return self._seeded

    def seed(self, times: list[float] | tuple[float, ...]) -> None:
        """Start from stored per-sample times (a reused profile): no warm-up is needed.
        Values that are not finite are left out, negative ones read as 0 (as in ``observe``)."""
        times = [max(0.0, t) for t in times if math.isfinite(t)]
        if self.config.fixed_s is not None or not times:
            return
        # Oldest first, so that samples measured in this run push them out first (and win
        # over them when the window cannot hold both); a second profile replaces the first.
        measured = list(self._times)[self._seeded:]
        window = self.config.window
        self._seeded = max(0, len(times) - max(0, len(times) + len(measured) - window))
        self._times = deque([*times, *measured], maxlen=window)
        self._array = None
        self._seen = max(self._seen, self.config.warmup_samples)
        self._recompute()

    def observe(self, sample_s: float, handed_off: bool) -> None:
        """Record one finished sample: its total step time (s) and whether it went slow.

        A time that is not finite (``nan``, ``inf``) is ignored, sample and all: one in the
        window would make the percentile ``nan`` or ``inf`` (no hand-off again). A negative one
        (a clock stepping back) counts as 0 s, never as a negative timeout. Called per sample
        (the scheduler thread): the common case is one comparison."""
        if not 0.0 <= sample_s < math.inf:  # (False for nan too)
            if not math.isfinite(sample_s):
                return
            sample_s = 0.0
        c = self.config
        self._seen += 1
        times = self._times
        if self._seeded and len(times) == times.maxlen:
            self._seeded -= 1  # the oldest value leaves: a stored quantile
        times.append(sample_s)
        if self._timeout != math.inf:
            slow = self._slow
            if len(slow) == slow.maxlen:
                self._slow_count -= slow[0]
            slow.append(handed_off)
            self._slow_count += handed_off
        self._since_update += 1
        if self._seen == c.warmup_samples or (
            self._seen > c.warmup_samples and self._since_update >= c.update_every
        ):
            self._recompute()

    def _recompute(self) -> None:
        c = self.config
        window = self._window_array(self._since_update)
        self._since_update = 0
        if c.fixed_s is None and self._drifted_down(window):
            window = window[-DRIFT_DOWN_RECORD:]
            self._seeded = 0  # those kept are all measured (_drifted_down): stored ones go
            self._times = deque(window.tolist(), maxlen=c.window)
            self._restart_flags()  # classified against the timeout that is now replaced
            self.drifts_down += 1
        self._array = window
        times = np.sort(window)
        self._typical = percentile(times, 50.0)
        if c.fixed_s is not None:
            return  # a fixed timeout: only the typical time is learned
        if self.percentile_in_force != self._slow_pct:  # the fallback ran out
            self._restart_flags()
        n = len(self._slow)
        if n >= c.update_every and self.slow_fraction > (
            c.max_slow_fraction if c.max_slow_fraction is not None
            else slow_share_limit(self._slow_pct, n, len(times))
        ):
            self._fallback_until = self._seen + c.window
            self._restart_flags()
        pct = self.percentile_in_force
        value = percentile(times, pct)
        self._timeout_pct = pct
        if value != self._timeout:
            self._timeout = value
            self.history.append((self._seen, value, pct))

    def _window_array(self, new: int) -> np.ndarray:
        """``_times`` as an array, oldest first: the one of the last recompute with the ``new``
        samples appended since (a few dozen) converted, the oldest ones dropped."""
        d = self._times
        n = len(d)
        if self._array is None or new >= n:
            return np.fromiter(d, float, count=n)
        tail = np.fromiter(islice(reversed(d), new), float, count=new)[::-1]
        return np.concatenate((self._array, tail))[-n:]

    def _drifted_down(self, times: np.ndarray) -> bool:
        """Whether clearly fewer of the latest ``DRIFT_DOWN_RECORD`` measured samples in
        ``times`` (the window, oldest first, seconds) reached the timeout in force than its
        percentile implies. At or over, not over: samples all of one time are at p75, not
        faster than it."""
        n = DRIFT_DOWN_RECORD
        if self._timeout == math.inf or len(times) - self._seeded < n:
            return False
        over = int(np.count_nonzero(times[-n:] >= self._timeout))
        return over < n * over_share_floor(self._timeout_pct, n, len(times))

    def _restart_flags(self) -> None:
        """Forget the slow flags: the ones to come are classified at another percentile."""
        self._slow.clear()
        self._slow_count = 0
        self._slow_pct = self.percentile_in_force


def slow_share_limit(pct: float, flags: int, basis: int) -> float:
    """Share (0..1) of ``flags`` classified samples gone slow above which more went slow than
    a timeout at percentile ``pct`` of ``basis`` samples implies, beyond chance.

    On a steady trace a share ``p = 1 - pct / 100`` goes slow, give or take the binomial noise
    of ``flags`` samples, ``p(1-p)/flags`` in variance, and the percentile's own, estimated over
    ``basis`` samples: the share of samples above it varies by ``p(1-p)/basis``. The limit is
    ``p`` plus ``FALLBACK_SD`` standard deviations of both (e.g. p75, 1024 and 1024: 0.327;
    32 and 1024: 0.56)."""
    p = 1 - pct / 100
    return p + FALLBACK_SD * math.sqrt(p * (1 - p) * (1 / flags + 1 / max(basis, 1)))


def over_share_floor(pct: float, samples: int, basis: int) -> float:
    """Share (0..1) of ``samples`` recent samples at or over a timeout at percentile ``pct`` of
    ``basis`` samples under which fewer reach it than the percentile implies, beyond chance:
    ``p = 1 - pct / 100`` less ``FALLBACK_SD`` standard deviations of the same two noises as
    :func:`slow_share_limit` (e.g. p75, 128 and 1024: 0.087; p90, 128 and 1024: below 0, never).
    """
    p = 1 - pct / 100
    return p - FALLBACK_SD * math.sqrt(p * (1 - p) * (1 / samples + 1 / max(basis, 1)))


def percentile(ordered: np.ndarray, q: float) -> float:
    """``np.percentile(ordered, q)`` (its default, linear method), bit for bit, of an array
    already sorted ascending: a few µs where ``np.percentile`` takes tens (it runs once every
    ``update_every`` samples, on the scheduler thread, which cheap samples keep busy)."""
    n = len(ordered)
    if n == 0:
        return math.nan
    virtual = (q / 100) * (n - 1)
    lo = math.floor(virtual)
    hi = min(lo + 1, n - 1)
    t = virtual - lo
    a, b = float(ordered[lo]), float(ordered[hi])
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


MOVES_TO_MEASURE = 4
"""Moves to the slow lane measured in an epoch before their mean cost counts against the next
ones (one move can carry one-off costs: a first shared-memory segment, a worker's imports)."""


def move_cost(moves: int, cpu_s: float) -> float:
    """Seconds one move costs the training process: ``cpu_s`` over ``moves``, this epoch's; 0
    until ``MOVES_TO_MEASURE`` were made. Every epoch lets its first moves happen and measures
    them afresh, so a cost that stopped moves once does not stop them for good."""
    return cpu_s / moves if moves >= MOVES_TO_MEASURE else 0.0


HANDOFF_MIN_SHARE = 0.5
"""A sample over the timeout is handed off only if the steps it has left typically take (sum of
their median times, less the measured cost of a move: :func:`remaining_after`) at least this
share of the timeout: moving a sample whose remaining work is trivial costs a round trip and
saves nothing (a departure from MinatoLoader, which moves every late sample)."""
HANDOFF_MIN_S = 0.002
"""...and at least this many seconds. A move adds a partial result, a task of its own and a
second result to the messages of a sample (each about 0.1-0.2 ms of CPU, ``planner/queueing.py``)
and holds back the refill of its worker's queue; ``move_cost`` counts only the forwarding. On
CIFAR-sized samples (steps of ~0.1 ms, a late one being a preempted one) 450-760 samples moved
per 20,000-sample epoch, each costing about 0.6 ms of training-process CPU and as much in the
workers: this floor gave 1.11x the samples/s (1.29x on tiny samples) with a third less
training-process CPU per sample (docs/benchmarks.md, "No hand-off for under 2 ms of steps
left"). Samples of a few milliseconds and more (every workload of ``headrace bench``) moved
none before it either."""


def worth_moving(spent_s: float, timeout_s: float, left_s: float) -> bool:
    """Whether a worker hands its sample off before the next step: it has spent ``spent_s``
    seconds of step time, over the timeout (``timeout_s``), and the steps it has left typically
    take ``left_s`` (net of a move's measured cost, :func:`remaining_after`), at least
    ``HANDOFF_MIN_SHARE`` of the timeout and ``HANDOFF_MIN_S``."""
    return spent_s > timeout_s and left_s >= max(HANDOFF_MIN_SHARE * timeout_s, HANDOFF_MIN_S)


def remaining_after(typical_s: Sequence[float], move_cost_s: float = 0.0) -> list[float]:
    """What a move to the slow lane leaves to gain before each step: entry ``i`` is the typical
    seconds of steps ``i..`` (the sum of their ``typical_s``, medians) less ``move_cost_s``,
    the training process's measured seconds to forward one sample's partial value (copy it out
    of the worker's ring, encode it, send it on); the last entry, past every step, is 0.

    Workers hand a sample off only when this is at least ``HANDOFF_MIN_SHARE`` × the timeout
    and ``HANDOFF_MIN_S`` (:func:`worth_moving`): a move whose forwarding costs the training
    process more than the steps it frees a worker from cannot pay (measured on 16 cores:
    0.13 s of training-process CPU per imagenet hand-off, against a few ms of steps left)."""
    out = [0.0] * (len(typical_s) + 1)
    acc = 0.0
    for i in range(len(typical_s) - 1, -1, -1):
        acc += typical_s[i]
        out[i] = acc - move_cost_s
    return out
