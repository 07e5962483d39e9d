"""A sample run with the cache: looked up first, its forms inserted (``run_cached``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.cache import codec
from headrace.cache.client import CacheClient


def run_cached(
    client: CacheClient | None,
    run: Callable[..., Any],
    index: int,
    start: int,
    value: Any,
    base_seed: int,
    epoch: int,
    row: int,
    **kwargs: Any,
) -> Any:
    """``run(index, start, value, base_seed, epoch, after_step=..., **kwargs)`` with the cache:
    a fresh sample (``start == 0``) is looked up first; a hit resumes after its form's step
    (or is the final value), and the forms the run produces are inserted. A repeat of its index
    (``kwargs["draw"]`` above 0) uses only the forms before the first random step."""
    from headrace.pipeline.runner import Outcome

    if client is None or not client.enabled:
        return run(index, start, value, base_seed, epoch, **kwargs)
    if start == 0:
        try:
            hit = client.lookup(index, base_seed, epoch, row, kwargs.get("draw", 0))
        except codec.CorruptEntry as e:
            import traceback

            return Outcome(None, None, [], (0, e, traceback.format_exc()))
        if hit is not None:
            start, value = hit
            if start >= client.layout.steps:
                return Outcome(value, None, [])
    ins = client.inserter(index, base_seed, epoch, start, row, kwargs.get("draw", 0))
    if ins is None:
        out = run(index, start, value, base_seed, epoch, **kwargs)
    else:
        out = run(index, start, value, base_seed, epoch, after_step=ins.after_step,
                  on_drew=ins.drew, **kwargs)
        if out.error is None:
            ins.commit()  # handed off or finished: the forms made so far
    client.observe(out.timings, row)
    return out


__all__ = ["run_cached"]
