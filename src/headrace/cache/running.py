"""A sample run with the cache: looked up first, its forms inserted, and where it drew from a
global random generator carried across a hand-off (``run_cached``).

A sample handed off to the slow lane (or kept by its worker when its value would not travel
as it is) runs in two parts, two calls here, often in two processes. The forms of the second
part are as epoch-dependent as the first part's draws made them, so the first drawing step
travels with the partial value (``Outcome.drew_at`` -> the ``partial`` message ->
``Task.drew_at``) and presets the second part's ``Insert.drew_at``: it stores no unseeded form
after that step. A sample not handed off carries nothing more (a ``None`` in its task).

A run that stores no form (the cost rule has every form of its steps off: ``Insert.stores``)
runs plain, without ``after_step`` at each step or its draws watched (a draw mark is about
2 µs a step); its forms are counted once it ended (``Insert.settle``). Handed off, such a part
carries ``MAY_HAVE_DRAWN`` (where a form a draw would change lies ahead): not watched, it may
have drawn anywhere, so the worker finishing it stores no unseeded form either, counted in
``not_stored`` as the part that started it judged them (not in ``drew``: nothing was seen to
draw, and ``explain()`` would advise declaring a step random). Storing less for the rare
sample handed off while the rule had its forms off is the price of not watching every other.

A few hits are computed as well and compared with their form (``cache/verify.py``): such a
sample runs from its ``load`` and delivers the computed value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.cache import codec
from headrace.cache.client import CacheClient
from headrace.cache.insert import MAY_HAVE_DRAWN
from headrace.cache.verify import Check, judge, locate


def run_cached(
    client: CacheClient | None,
    run: Callable[..., Any],
    index: int,
    start: int,
    value: Any,
    base_seed: int,
    epoch: int,
    row: int,
    drew_at: int | None = None,
    watch_draws: bool = False,
    **kwargs: Any,
) -> Any:
    """``run(index, start, value, base_seed, epoch, after_step=..., **kwargs)`` with the cache:
    a fresh sample (``start == 0``) is looked up first; a hit resumes after its form's step
    (or is the final value), and the forms the run produces are inserted. A repeat of its index
    (``kwargs["draw"]`` above 0) uses only the forms before the first random step.

    ``drew_at``: where a sample resumed after a hand-off drew from a global generator in its
    earlier part (``Outcome.drew_at`` of that part, carried by the scheduler in
    ``Task.drew_at``): its forms from here on differ each epoch too, and none is stored. The
    outcome's ``drew_at`` says where it drew so far, for a later part; a run that may be
    handed off is watched also where this process stores nothing (its tiers are full here, not
    in the worker that takes it; ``watch_draws``: a remote worker, which has no cache)."""
    from headrace.pipeline.runner import Outcome

    if client is None or not client.enabled:
        if watch_draws and kwargs.get("hand_off") is not None:
            return _watched(run, index, start, value, base_seed, epoch, drew_at, kwargs)
        out = run(index, start, value, base_seed, epoch, **kwargs)
        out.drew_at = drew_at
        return out
    if start == 0:
        try:
            hit = client.lookup(index, base_seed, epoch, row, kwargs.get("draw", 0))
        except codec.CorruptEntry as e:
            import traceback

            return Outcome(None, None, [], (0, e, traceback.format_exc()))
        if hit is not None and isinstance(hit[1], Check):
            out = _checked(client, run, index, hit[1], base_seed, epoch, row, drew_at, kwargs)
            client.observe(out.timings, row)
            return out
        if hit is not None:  # its prefix drew nothing in the run that stored it
            start, value = hit
            if start >= client.layout.steps:
                return Outcome(value, None, [])
    ins = client.inserter(index, base_seed, epoch, start, row, kwargs.get("draw", 0))
    if ins is not None and not ins.stores:  # the cost rule has its forms off: run plain
        out = run(index, start, value, base_seed, epoch, **kwargs)
        end = out.next_step if out.next_step is not None else (  # steps it ran (a failed
            out.error[0] if out.error is not None else client.layout.steps)  # one: before it)
        ins.drew_at = drew_at
        ins.settle(start, end, out.error is None)
        out.drew_at = drew_at if drew_at is not None or out.next_step is None or \
            start > client.draws_matter_through else MAY_HAVE_DRAWN
    elif ins is None:
        if kwargs.get("hand_off") is not None and any(p >= start for p in client.at_position):
            out = _watched(run, index, start, value, base_seed, epoch, drew_at,
                           dict(kwargs, drew_through=client.draws_matter_through))
        else:
            out = run(index, start, value, base_seed, epoch, **kwargs)
            out.drew_at = drew_at
    else:
        ins.drew_at = drew_at
        out = run(index, start, value, base_seed, epoch, after_step=ins.after_step,
                  on_drew=ins.drew, drew_through=client.draws_matter_through, **kwargs)
        out.drew_at = ins.drew_at
        if out.error is None:
            ins.commit()  # handed off or finished: the forms made so far
    client.observe(out.timings, row)
    return out


def _checked(client: CacheClient, run: Callable[..., Any], index: int, check: Check,
             base_seed: int, epoch: int, row: int, drew_at: int | None,
             kwargs: dict[str, Any]) -> Any:
    """The run of a hit to check (``cache/verify.py``): from ``load``, as a miss; the form is
    compared with ``check.blob`` right after its step, and the forms after it are inserted as
    on a hit. The outcome is the computed one, whatever the verdict."""
    ins = client.inserter(index, base_seed, epoch, check.position + 1, row,
                          kwargs.get("draw", 0))
    first = _FirstDraw(drew_at)

    def after(i: int, x: Any) -> None:
        if i == check.position:
            check.compare(x)
        elif i > check.position and ins is not None:
            ins.after_step(i, x)

    def drew(i: int) -> None:
        first(i)
        if ins is not None:
            ins.drew(i)

    out = run(index, 0, None, base_seed, epoch, after_step=after, on_drew=drew,
              drew_through=client.draws_matter_through, **kwargs)
    out.drew_at = first.at
    if out.error is None and ins is not None:
        ins.commit()
    judge(client.counters, check, row,
          lambda: locate(run, index, base_seed, epoch, check.position, kwargs))
    return out


class _FirstDraw:
    """``on_drew`` for a run nothing is inserted from: keeps the first drawing step."""

    __slots__ = ("at",)

    def __init__(self, at: int | None) -> None:
        self.at = at

    def __call__(self, position: int) -> None:
        if self.at is None:
            self.at = position


def _watched(run: Callable[..., Any], index: int, start: int, value: Any, base_seed: int,
             epoch: int, drew_at: int | None, kwargs: dict[str, Any]) -> Any:
    first = _FirstDraw(drew_at)
    out = run(index, start, value, base_seed, epoch, on_drew=first, **kwargs)
    out.drew_at = first.at
    return out


__all__ = ["run_cached"]
