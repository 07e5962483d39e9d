"""The cache's empirical check that a cached form is what its steps compute now (validation as
in Seneca's cache: a cached sample must equal a computed one).

Reading code cannot find every draw a step makes. The runner sees draws from Python's, NumPy's
and torch's global generators (``draw_marks.draw_mark``, ``Insert.drew``) and the digest sees a
generator held in a step's state (``digest_scope.Findings``), but not a helper of another module
drawing from that module's generator, a generator the step makes itself
(``np.random.default_rng()``, ``torch.Generator().seed()``), nor a source whose ``load`` draws
from one: their first epoch's draws were served in every later epoch (a cache review: 5 of 14
placements, hits [0, 8, 8], one value every epoch, where torch and ``cache=None`` gave three).

So a few hits are computed as well (``run_cached``): the sample runs from its ``load`` as a miss
does, and its form is compared, right after the form's step, with the stored entry by value
(:func:`difference`): equal types, a dict's keys and values whatever their order, lists and
tuples item by item, arrays and tensors by dtype, shape and the bytes of their elements (a NaN
equals a NaN of the same bits; strides and a read-only flag are not compared). The encodings
are compared first, and the entry is decoded only when they differ: ``codec.encode`` follows
a dict's insertion order, and a deterministic step building a dict from a set of strings has
its keys in another order in each process (each has its own string-hash seed: spawned workers,
a restarted job, two jobs sharing one Redis), which a comparison of bytes took for another
value (a review: the form turned off in 3 of 3 runs with ``multiprocessing_context="spawn"``).
The computed value is what the sample delivers, so a check never serves a stale value. A form
that differs is off for the rest of the run, in every worker (``Verdicts``, shared memory): not
looked up, not stored; the training process warns once, saying where the values first differ
(``value['boxes'][3]: 1 of 4 elements differ``), and ``explain()`` names the step found to give
another output for the same input (two more runs of the form's steps, compared step by step)
and the fix (``random=True``, drawing from the ``rng`` it is given). A form that matched is
*verified*.

Rate: ``CHECKS_UNVERIFIED`` checks per worker slot, epoch and form while the form is not
verified, then ``CHECKS_VERIFIED``. Each check costs one computation of the steps the hit would
skip (the steps after it run anyway). Two, not one: a step that draws on some samples only (a
flip with p=0.5 from a hidden generator) is missed by one check with probability 1/2, by two
in every worker with 1/2^(2 x workers). One check per worker and epoch afterwards, not none: a
step that becomes non-deterministic later (a branch taken late, a global the script changes)
is still caught, for one prefix computation per worker and epoch, a small share of an epoch
of thousands of samples per worker.

What it does not find: a difference that none of the checked samples shows (a step drawing on
rare samples only), and one in what is not compared (a dict's key order, an array's strides).
A float result that varies in its last bit between runs is found to differ, and is then not
served: it was not what the steps compute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.cache import codec
from headrace.cache.tiers import TIERS
from headrace.cache.value_difference import difference

CHECKS_UNVERIFIED = 2
"""Hits checked per worker slot, epoch and form while the form is not verified."""
CHECKS_VERIFIED = 1
"""Hits checked per worker slot, epoch and form once it is (module docstring)."""

UNVERIFIED, VERIFIED, DIFFERS = 0, 1, 2
"""A form's verdict (``Verdicts.state``)."""


WHERE_BYTES = 240
"""Bytes of UTF-8 kept per form for where its values first differed (``Verdicts.where``)."""


_AT = {name: 3 * i for i, name in enumerate(TIERS)}
"""Where each tier's state is in ``Verdicts.values`` (read at every lookup and insert)."""


class Verdicts:
    """Each form's verdict for one cache session, in shared memory (made with the
    ``multiprocessing`` context ``ctx``, shared with worker processes like the counters).

    Per tier, in the order of ``TIERS``: its state (``UNVERIFIED``, ``VERIFIED``, ``DIFFERS``),
    then the first and last execution step (position + 1; 0: not located) among which one was
    found to give another output for the same input; and, in ``text``, where the stored and
    computed values first differed (UTF-8, ``WHERE_BYTES`` a tier, cut there). Written by the
    process that checked; a race of two writers writes the same state (the text then is
    either's, or a mix of both: it only explains)."""

    def __init__(self, ctx: Any) -> None:
        self.values = ctx.RawArray("q", 3 * len(TIERS))
        self.text = ctx.RawArray("c", WHERE_BYTES * len(TIERS))

    def state(self, tier: str) -> int:
        return int(self.values[_AT[tier]])

    def verified(self, tier: str) -> None:
        k = 3 * TIERS.index(tier)
        if self.values[k] == UNVERIFIED:
            self.values[k] = VERIFIED

    def differs(self, tier: str, steps: tuple[int, int] | None, where: str = "") -> None:
        """``tier``'s form differed, first at ``where`` (:func:`difference`); ``steps``:
        (first, last) position among which one gave another output for the same input (None:
        not located)."""
        k = 3 * TIERS.index(tier)
        lo, hi = steps if steps is not None else (-1, -1)
        self.values[k + 1], self.values[k + 2] = lo + 1, hi + 1
        raw = where.encode("utf-8")[:WHERE_BYTES].decode("utf-8", "ignore").encode("utf-8")
        at = TIERS.index(tier) * WHERE_BYTES
        self.text[at:at + WHERE_BYTES] = raw.ljust(WHERE_BYTES, b"\0")
        self.values[k] = DIFFERS

    def located(self, tier: str) -> tuple[int, int] | None:
        """(first, last) position of the steps found to vary, None: not located."""
        k = 3 * TIERS.index(tier)
        lo, hi = int(self.values[k + 1]), int(self.values[k + 2])
        return (lo - 1, hi - 1) if lo > 0 else None

    def where(self, tier: str) -> str:
        """Where ``tier``'s stored and computed values first differed ("": not said)."""
        at = TIERS.index(tier) * WHERE_BYTES
        return bytes(self.text[at:at + WHERE_BYTES]).rstrip(b"\0").decode("utf-8", "replace")


class Check:
    """A hit of ``tier`` (the output of step ``position``) to compute and compare: ``blob``,
    the stored encoding. ``same``: the verdict once the computed form was compared (None: the
    run did not reach the form's step, a hand-off or an error); ``where``: where the values
    first differed when they did (:func:`difference`)."""

    __slots__ = ("blob", "position", "same", "tier", "where")

    def __init__(self, tier: str, position: int, blob: bytes) -> None:
        self.tier, self.position, self.blob = tier, position, blob
        self.same: bool | None = None
        self.where = ""

    def compare(self, value: Any) -> None:
        """``value``: the form computed now, right after its step; compared by value with the
        stored one (:func:`difference`), which is decoded only when the encodings differ (a
        value that no longer encodes differs from the stored one)."""
        try:
            blob = codec.encode(value)
        except Exception as e:  # noqa: BLE001 - Uncacheable, or it fails to encode: not the stored
            self.same, self.where = False, f"value: the computed form cannot be stored ({e})"
            return
        self.where = "" if blob == self.blob else (difference(codec.decode(self.blob), value)
                                                   or "")
        self.same = not self.where


def judge(counters: Any, check: Check, row: int,
          locate: Callable[[], tuple[int, int] | None]) -> None:
    """Record a check's verdict (``check.same``) in ``counters`` (``client.Counters``, row
    ``row``): counted in ``checked`` (and ``differed``); a form that differed is off for the
    rest of the run, in every worker, with the steps ``locate()`` finds (:func:`locate`),
    located once."""
    if check.same is None:  # the run did not reach the form's step
        return
    counters.add(row, "checked")
    verdicts = counters.verdicts
    if check.same:
        verdicts.verified(check.tier)
        return
    counters.add(row, "differed")
    if verdicts.state(check.tier) != DIFFERS:
        verdicts.differs(check.tier, locate(), check.where)


def kept(buf: Any) -> bytes:
    """The decoder of a hit to check: validates the blob (``CorruptEntry`` as for any hit)
    and keeps its bytes (the value is computed, not decoded for use)."""
    codec.decode(buf)
    return bytes(buf)


def locate(run: Callable[..., Any], index: Any, base_seed: int, epoch: int, position: int,
           kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """The steps among which one gives another output for the same input: steps
    ``0..position`` run twice more with the sample's seeds, their outputs encoded after each
    step; the first step whose outputs differ (by value: :func:`difference`), from the step after the last one whose outputs
    were equal (a step whose output does not encode cannot be told apart from the next).
    None: both runs agree at every step (what the steps read differs from when the form was
    stored: a global or a file the script changed since, in this job or the one that stored it)."""
    kw = {k: v for k, v in kwargs.items() if k != "hand_off"}
    runs: list[dict[int, bytes | None]] = []
    for _ in range(2):
        seen: dict[int, bytes | None] = {}

        def after(i: int, x: Any, seen: dict[int, bytes | None] = seen) -> None:
            try:
                seen[i] = codec.encode(x)
            except Exception:  # noqa: BLE001 - not comparable here
                seen[i] = None

        run(index, 0, None, base_seed, epoch, after_step=after,
            hand_off=lambda nxt, _s: nxt > position, **kw)
        runs.append(seen)
    lo = 0
    for i in range(position + 1):
        a, b = runs[0].get(i), runs[1].get(i)
        if a is None or b is None:
            continue
        if a != b and difference(codec.decode(a), codec.decode(b)) is not None:
            return lo, i
        lo = i + 1
    return None


__all__ = ["CHECKS_UNVERIFIED", "CHECKS_VERIFIED", "Check", "Verdicts"]
