"""AutoOrder's cost model: the expected CPU seconds per sample of a step order.

A step's CPU time is taken as proportional to its input bytes, ``cpu_i * b / bytes_in_i``,
where ``cpu_i`` and ``bytes_in_i`` are measured and ``b`` is the input size the step gets in the
order considered: the pipeline's input size times the factors of the steps before it. Steps
with a fixed cost (I/O, per-call overhead) make the estimate of a reorder's gain optimistic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["expected_cpu"]


def expected_cpu(
    order: Sequence[int] | range,
    cpu: Sequence[float],
    bytes_in: Sequence[float],
    inflation: Sequence[float | None],
    input_bytes: float,
) -> float:
    """Expected CPU seconds per sample of running the steps in ``order`` (indices).

    Step ``i`` costs ``cpu[i] * b / bytes_in[i]`` where ``b`` is its input bytes in this order:
    ``input_bytes`` times the factors of the steps before it (unknown factors count as 1). A
    step measured without input bytes costs ``cpu[i]`` whatever its input.
    """
    b, total = float(input_bytes), 0.0
    for i in order:
        total += cpu[i] * (b / bytes_in[i]) if bytes_in[i] > 0 and b > 0 else cpu[i]
        f = inflation[i]
        if f is not None and math.isfinite(f):
            b *= f
    return total
