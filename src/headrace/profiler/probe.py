"""Is training input-bound or accelerator-bound? FastFlow's Gthp/Lthp probe (§5.1, Algorithm 1).

Two consumer throughputs, in batches per second, with the user's own ``train_step`` and without
touching the model:

* **Lthp** (``thp(P + M)``): batches taken from the loader, each passed to ``train_step``, so
  preprocessing and training run together as they do in the real job;
* **Gthp** (``thp(M)``): one batch taken from that same loader, kept, and passed to
  ``train_step`` again and again (FastFlow's ``take(1).cache().repeat()``), so the input
  pipeline costs nothing.

When the pipeline keeps up, ``Lthp`` equals ``Gthp``. FastFlow calls the job input-bound (a prep
stall) only when removing preprocessing would speed it up by more than ``SpeedUpThreshold``
(10% by default): here, when ``Lthp < (1 - threshold) × Gthp``.

Lthp is measured first and the loader's iterator is closed before Gthp is measured, so the
loader's workers do not compete with the replayed steps for CPU. The probe runs in the calling
process, on the training loop's side of the loader: any iterable of batches works (a
``headrace.DataLoader``, torch's, a generator).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

__all__ = ["DEFAULT_THRESHOLD", "ProbeResult", "Verdict", "probe"]

DEFAULT_THRESHOLD = 0.10
"""FastFlow's default ``SpeedUpThreshold``: a prep stall is worth acting on above a 10% gain."""

Verdict = Literal["input-bound", "accelerator-bound"]


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """The probe's two throughputs and its verdict.

    Attributes:
        lthp: consumer throughput with real data from the loader, batches per second
            (FastFlow's Lthp = thp(P + M)).
        gthp: consumer throughput replaying one cached batch, batches per second
            (FastFlow's Gthp = thp(M)).
        batches: batches timed for ``lthp`` (after the warm-up).
        replays: times the cached batch was timed for ``gthp`` (after the warm-up).
        warmup: batches (and replays) run before each clock started, not timed.
        lthp_wall_s, gthp_wall_s: seconds each timed window lasted.
        threshold: the speed-up below which the job counts as accelerator-bound (0.10: 10%).
        verdict: ``"input-bound"`` when ``lthp < (1 - threshold) * gthp``, else
            ``"accelerator-bound"``.
    """

    lthp: float
    gthp: float
    batches: int
    replays: int
    warmup: int
    lthp_wall_s: float
    gthp_wall_s: float
    threshold: float
    verdict: Verdict

    @property
    def input_bound(self) -> bool:
        """True when the input pipeline holds training back by more than ``threshold``."""
        return self.verdict == "input-bound"

    @property
    def speedup(self) -> float:
        """``gthp / lthp``: how much faster training would run with free preprocessing (×)."""
        return self.gthp / self.lthp if self.lthp > 0 else math.inf

    @property
    def stall_fraction(self) -> float:
        """Share of the consumer's time spent waiting for data, ``1 - lthp / gthp`` (0..1).

        0 when the loader keeps up (a noisy measurement may give ``lthp > gthp``: clipped to 0).
        """
        if self.gthp <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.lthp / self.gthp))

    def describe(self) -> str:
        """One line: the verdict and the numbers behind it."""
        limit = 1.0 - self.threshold
        ratio = self.lthp / self.gthp if self.gthp > 0 else math.nan
        cmp = "<" if self.input_bound else ">="
        tail = (
            f"the training loop waits for data {100 * self.stall_fraction:.0f}% of the time; "
            f"free preprocessing would run it {self.speedup:.2f}x faster"
            if self.input_bound
            else f"the input pipeline keeps up within {100 * self.threshold:g}%"
        )
        return (
            f"{self.verdict}: {self.lthp:.2f} batches/s with real data (Lthp, {self.batches} "
            f"batches) vs {self.gthp:.2f} batches/s replaying one cached batch (Gthp, "
            f"{self.replays} replays); Lthp/Gthp = {ratio:.2f} {cmp} {limit:.2f}, so {tail} "
            "(FastFlow §5.1)"
        )


def probe(
    loader: Iterable[Any],
    train_step: Callable[[Any], Any],
    batches: int | None = 20,
    warmup: int = 3,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    replays: int | None = None,
    sync: Callable[[], Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ProbeResult:
    """Measure Lthp and Gthp with ``train_step`` and say whether training is input-bound.

    Args:
        loader: any iterable of batches; one iterator is drawn from it (one epoch, or part of
            one) and closed afterwards when it has a ``close()`` method.
        train_step: called once per batch, ``train_step(batch)``; its result is ignored. It
            should run what one training iteration runs (forward, backward, optimizer step).
        batches: batches timed with real data after the warm-up; ``None``: the rest of the
            epoch. When the epoch ends first, the batches seen so far are used.
        warmup: batches consumed before the clock starts (worker start-up, first-call costs),
            and replays run before Gthp's clock starts.
        threshold: FastFlow's ``SpeedUpThreshold`` (0 <= threshold < 1; default 10%).
        replays: times the cached batch is replayed for Gthp (default: as many as ``batches``
            timed).
        sync: called before each clock reading, e.g. ``torch.cuda.synchronize``, so that
            asynchronous accelerator work is counted where it happens.
        clock: a monotonic clock in seconds (tests inject a fake one).

    Raises:
        ValueError: bad arguments, or the loader ran out before one batch could be timed.
    """
    if batches is not None and batches < 1:
        raise ValueError(f"batches must be >= 1 (or None for the whole epoch), got {batches}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold}")
    if replays is not None and replays < 1:
        raise ValueError(f"replays must be >= 1, got {replays}")

    def now() -> float:
        if sync is not None:
            sync()
        return clock()

    it = iter(loader)
    try:
        cached, n, lthp_wall = _measure_lthp(it, train_step, batches, warmup, now)
    finally:
        close = getattr(it, "close", None)
        if callable(close):
            close()  # stop the loader's workers before Gthp: they would compete for the CPU
        del it
    reps = replays if replays is not None else n
    for _ in range(warmup):
        train_step(cached)
    t0 = now()
    for _ in range(reps):
        train_step(cached)
    gthp_wall = now() - t0
    lthp = n / lthp_wall if lthp_wall > 0 else math.inf
    gthp = reps / gthp_wall if gthp_wall > 0 else math.inf
    verdict: Verdict = "input-bound" if lthp < (1.0 - threshold) * gthp else "accelerator-bound"
    return ProbeResult(lthp, gthp, n, reps, warmup, lthp_wall, gthp_wall, threshold, verdict)


def _measure_lthp(
    it: Iterator[Any],
    train_step: Callable[[Any], Any],
    batches: int | None,
    warmup: int,
    now: Callable[[], float],
) -> tuple[Any, int, float]:
    """(the cached batch, batches timed, seconds they took) consuming ``it`` with ``train_step``."""
    cached: Any = _MISSING
    for k in range(warmup):
        batch = next(it, _MISSING)
        if batch is _MISSING:
            raise ValueError(
                f"the loader ran out after {k} batches, during the {warmup}-batch warm-up; "
                "lower warmup or give the loader more samples"
            )
        if cached is _MISSING:
            cached = batch
        train_step(batch)
    n = 0
    t0 = now()
    while batches is None or n < batches:
        batch = next(it, _MISSING)
        if batch is _MISSING:
            break
        if cached is _MISSING:
            cached = batch
        train_step(batch)
        n += 1
    wall = now() - t0
    if n == 0:
        raise ValueError(
            f"the loader ran out after the {warmup}-batch warm-up: no batch left to time; "
            "lower warmup or give the loader more samples"
        )
    return cached, n, wall


_MISSING: Any = object()
