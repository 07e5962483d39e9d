"""Which forms of a sample are cached, after which step, and under which key (pure).

Positions are execution steps (0 = ``Source.load``, then the pipeline's steps in the *executed*
order, after AutoOrder):

* **encoded**: the source's output (after step 0);
* **decoded**: the output of the last deterministic step before the first random step (a
  step declared ``random=True`` or ``kind="augment"``: ``Step.varies``; or one whose state
  holds a random generator it may draw from, ``digest_scope.Findings``);
* **augmented**: the final output.

A hit on a form at position ``p`` skips steps ``0..p`` and runs ``p+1..`` as usual with the same
per-sample seeds, so it is identical to a miss. Forms that fall on the same position merge into
the most processed one (no random step: the final output is deterministic and is the *decoded*
form; a random first step: no decoded form). An opaque dataset (one step) has only its final
output, which is the *augmented* form.

A key is ``namespace (16 bytes) + sample index (8 bytes; 17 for other sampler keys)``. The namespace hashes the tier, the
fingerprint of the prefix (each step up to the form: name, traits, code identity) and of the
source, so a changed step never serves stale data; no form lies at or after a step (or any, for
a source) whose state its digest could not follow whole. Forms after a random step are exact only for
one (base seed, epoch): their namespace includes both, unless ``shared_augmented`` (Seneca's
trade: content then depends on what other epochs or jobs drew).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from headrace.pipeline.code_digest import code_identity
from headrace.pipeline.digest_scope import Findings, digest_scope
from headrace.pipeline.fingerprint import source_fingerprint
from headrace.pipeline.seeding import index_key

if TYPE_CHECKING:
    from headrace.pipeline.pipeline import Pipeline

TIERS = ("encoded", "decoded", "augmented")
"""Tier names, least processed first."""

NS_BYTES = 16
"""Length of a key's namespace prefix (bytes)."""


@dataclasses.dataclass(frozen=True)
class Tier:
    """One cached form.

    Attributes:
        name: ``"encoded"``, ``"decoded"`` or ``"augmented"``.
        position: the execution step whose output this form is (0 = load).
        seeded: the form comes after a random step, so it is exact only for one (base seed,
            epoch): its namespace includes them unless ``shared``.
        shared: (augmented only) served across epochs and jobs (opt-in, Seneca's trade); an
            entry is then served once and dropped.
        prefix: fingerprint of steps ``0..position`` and of the source (hex).
    """

    name: str
    position: int
    seeded: bool
    shared: bool
    prefix: str

    def namespace(self, base_seed: int, epoch: int) -> bytes:
        """The key prefix for this form's entries in (base seed, epoch)."""
        h = hashlib.blake2b(digest_size=NS_BYTES)
        h.update(f"{self.name}|{self.prefix}".encode())
        if self.seeded and not self.shared:
            h.update(f"|{base_seed}|{epoch}".encode())
        return h.digest()


@dataclasses.dataclass(frozen=True)
class TierLayout:
    """The forms a pipeline can cache, most processed first (the lookup order)."""

    tiers: tuple[Tier, ...]
    steps: int
    """Number of execution steps (load included)."""
    notes: tuple[str, ...] = ()
    """Why steps count as random or are not keyed although not declared so, in words (for
    ``explain()``)."""

    @classmethod
    def for_pipeline(cls, pipeline: Pipeline, shared_augmented: bool = False) -> TierLayout:
        """The forms of ``pipeline``, keyed by its source's content and its steps' code as
        they are now (the cache plans each epoch anew: a source or step the script changed
        between epochs gets other entries). A step (or source) whose state holds a random
        generator counts as random, and no form is kept at or after one whose state its
        digest could not follow whole (``digest_scope.Findings``); ``notes`` says why."""
        whole = pipeline.opaque or pipeline.embedded  # one unit of work: __getitem__
        n = 1 if whole else len(pipeline.step_names)
        fps, found = _prefix_fingerprints(pipeline)
        names = ["the source", *(f"step {s.name!r}" for s in pipeline.steps)]
        randoms = [found[0].generator is not None,
                   *(s.varies or f.generator is not None for s, f in zip(
                       pipeline.steps, found[1:], strict=True))]
        cuts = [f.cut is not None for f in found]
        if whole:  # its steps run inside one unit: the first random or cut one is its own
            randoms, cuts = [any(randoms)], [any(cuts)]
        first_random = next((i for i, r in enumerate(randoms) if r), None)
        unkeyed = next((i for i, c in enumerate(cuts) if c), None)
        last = n - 1
        positions: dict[str, int] = {"encoded": 0}
        if whole:
            positions = {"augmented": last}
        elif first_random is None:
            positions["decoded"] = last
        else:
            if first_random - 1 > 0:
                positions["decoded"] = first_random - 1
            positions["augmented"] = last
        if unkeyed is not None:  # no form at or after it: the deterministic one just before
            positions = {k: p for k, p in positions.items() if p < unkeyed}
            if (not whole and "decoded" not in positions and unkeyed - 1 > 0
                    and (first_random is None or unkeyed <= first_random)):
                positions["decoded"] = unkeyed - 1
        # merge forms that fall on the same position into the most processed one
        by_pos: dict[int, str] = {}
        for name in TIERS:
            if name in positions:
                by_pos[positions[name]] = name
        tiers = []
        for pos, name in sorted(by_pos.items(), reverse=True):
            seeded = first_random is not None and pos >= first_random or whole
            tiers.append(Tier(name, pos, seeded, shared_augmented and name == "augmented",
                              fps[pos]))
        notes = []
        for i, f in enumerate(found):
            declared = i > 0 and pipeline.steps[i - 1].varies
            if f.generator is not None and not declared:
                notes.append(_generator_note(names[i], f.generator))
            if f.cut is not None:
                notes.append(f"{names[i]} is not keyed: its state could not be hashed whole "
                             f"({f.cut}), so no form at or after it is cached; "
                             + _FIXES[i > 0, f.too_large])
        return cls(tuple(tiers), n, tuple(notes))

    def get(self, name: str) -> Tier | None:
        return next((t for t in self.tiers if t.name == name), None)

    def keyed_as(self, other: TierLayout | None, names: Iterable[str]) -> bool:
        """Whether the forms ``names`` are keyed here as in ``other``: what it stored of them
        still serves (the cache's split is kept across epochs only then)."""
        return other is not None and all(self.get(n) == other.get(n) for n in names)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)


_SOURCE_FIX = ("give the source a fingerprint() method returning a string that changes "
               "whenever what it loads does (hr.sources.Files has one), or hold its tables "
               "as plain values (dicts, lists, tuples of str, int, float, bytes, None: "
               "hashed whole)")
"""How to key a source the cache could not key (the end of its ``explain()`` note)."""
_STEP_FIX = ("hold its tables as plain values (dicts, lists, tuples of str, int, float, bytes, "
             "None: hashed whole) or as an array, or keep large objects (a model, a framework) "
             "out of the step's state")
"""How to key a step the cache could not key (the end of its ``explain()`` note)."""
_FIXES = {(False, False): _SOURCE_FIX, (True, False): _STEP_FIX,
          (False, True): "give the source a fingerprint() method returning a string that "
                         "changes whenever what it loads does (hr.sources.Files has one)",
          (True, True): "keep a table that large out of the step's state (in the source, "
                        "with its own fingerprint() method)"}
"""The end of an ``explain()`` note, by (a step, not the source; its state was plain values
too large to hash whole, ``Findings.too_large``)."""


def _generator_note(name: str, kind: str) -> str:
    return (f"{name} holds a random generator ({kind}) and may draw from it, so it counts as "
            "random: nothing at or after it is cached as deterministic (a step declared "
            "random=True draws from the rng it is given, with the same draws in every worker, "
            "and its output is cached per epoch)")


def _prefix_fingerprints(pipeline: Pipeline) -> tuple[list[str], list[Findings]]:
    """``fps[p]``: hash of the source (by content) and of execution steps ``1..p`` (name,
    traits, code); ``found[p]``: what the digest of the source (``p`` 0) or step ``p`` met
    (a random generator, state it could not follow whole)."""
    with digest_scope(complete=True) as source_found:
        source = source_fingerprint(pipeline.source, content=True)
    h = hashlib.sha256(source.encode())
    h.update(f"|opaque={pipeline.opaque}".encode())
    out, found = [h.hexdigest()[:16]], [source_found]
    for s in pipeline.steps:
        h.update(f"{s.name}|{s.random}|{s.keep_position}|{s.kind}|{s.commutes}|".encode())
        with digest_scope(complete=True) as step_found:
            h.update(code_identity(s.fn).encode())
        h.update(b"\x00")
        out.append(h.copy().hexdigest()[:16])
        found.append(step_found)
    return out, found


def sample_key(namespace: bytes, index: Any) -> bytes:
    """The key of sample ``index`` in ``namespace``: 8 bytes for an integer index below 2^64,
    else the 17 bytes of its seed key (``seeding.index_key``: NumPy's and torch's integers,
    strings, tuples, negative indices)."""
    if type(index) is int and 0 <= index < 1 << 64:
        return namespace + index.to_bytes(8, "big")
    key = index_key(index)
    return namespace + key.to_bytes(8 if key < 1 << 64 else 17, "big")
