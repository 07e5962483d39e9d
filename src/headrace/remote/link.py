"""Measuring the link to the remote workers and what receiving a sample costs here.

FastFlow's decision needs the bandwidth between the remote workers and the training host and
the local CPU an offloaded sample costs (``planner/offload.py``: ``bandwidth``, ``overhead_s``).
``plan_offload`` measures both with a short probe (``ray_backend.probe_link``) against a
:class:`LinkEcho` actor placed like a remote worker: a few round trips of a tiny call (latency,
and the fixed local CPU of one call), then arrays of ``PROBE_BYTES`` coming back through Ray
(bandwidth = bytes ÷ (time − latency); local CPU per byte = this thread's CPU time to get and
unpack them ÷ bytes). The link is taken as symmetric (samples shipped to remote workers, with
``Remote(read_source=False)``, use the same bandwidth). Bounded: ``PROBE_BUDGET_S`` of
transfers after the actor starts. A plain class (no Ray import): ``ray_backend`` wraps it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

PROBE_BYTES = 4 << 20
"""Bytes per bandwidth sample (4 MiB: well above Ray's 100 KiB inline limit, so it crosses
the object store as a large sample would)."""
PROBE_BUDGET_S = 0.3
"""Seconds of transfers the probe may spend (at least one large array is timed)."""


class LinkEcho:
    """The remote end of the probe (imports NumPy only: it starts in a fresh Ray worker fast)."""

    def ping(self) -> int:
        return 0

    def blob(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of data (random, so no layer can compress it away)."""
        return np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)


@dataclasses.dataclass(frozen=True)
class LinkMeasure:
    """What the probe measured.

    ``bandwidth``: bytes/s from a remote worker to this host; ``latency_s``: one tiny round
    trip (seconds); ``call_cpu_s``: this thread's CPU seconds for one tiny call;
    ``cpu_per_byte_s``: this thread's CPU seconds per byte received (getting and unpacking);
    ``samples``: large arrays timed.
    """

    bandwidth: float
    latency_s: float
    call_cpu_s: float
    cpu_per_byte_s: float
    samples: int

    def overhead_s(self, bytes_per_sample: float) -> float:
        """Local CPU seconds one offloaded sample of ``bytes_per_sample`` costs here."""
        return self.call_cpu_s + self.cpu_per_byte_s * max(0.0, bytes_per_sample)

    def describe(self) -> str:
        return (f"link measured: {self.bandwidth / 1e6:.0f} MB/s, round trip "
                f"{1e3 * self.latency_s:.2f} ms, local CPU {1e6 * self.call_cpu_s:.0f} us per "
                f"call + {1e9 * self.cpu_per_byte_s:.2f} ns per byte received "
                f"({self.samples} x {PROBE_BYTES >> 20} MiB)")
