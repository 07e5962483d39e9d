"""Human-readable durations and sizes for every report headrace prints (explain, plan, profile)."""

from __future__ import annotations

import math


def duration(seconds: float) -> str:
    """``seconds`` as "1.23 s", "4.5 ms" or "120 µs" ("inf" when infinite or NaN)."""
    if not math.isfinite(seconds):
        return "inf"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.1f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f} µs"


def size(nbytes: float) -> str:
    """``nbytes`` in decimal units: "2.3 MB", "150.5 KB", "250 B"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:.0f} B"
