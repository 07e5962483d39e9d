"""One whole digest (``value_digest.state_digest`` and ``code_digest.code_identity`` of a step,
a source, a value, and all they reach): the budgets it shares, the path it follows (cycles,
nesting) and what it found besides values (:class:`Findings`), and the names both modules give
objects.

State is followed at any depth; what cannot be followed whole is recorded, never cut
silently (``value_digest``'s module docstring).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import random
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

MAX_NESTING = 64
"""Objects and containers nested in one another that one digest follows (an object and its
``__dict__`` are two; a ``Compose([Resize(224)])`` step reaches the 224 through 4: object,
state, list, transform state). Deeper, the digest is incomplete (:class:`Findings` ``cut``):
a ResNet's weights lie 12 down, a linked list of 40 nodes does not end. A level takes 3.5 to
4.5 Python frames (measured), so 64 take about 300 of the interpreter's 1,000; a
``RecursionError`` all the same (a caller deep in its stack) makes the digest incomplete too."""
TOTAL_NODES = 1 << 14
"""Objects and containers (not scalars, arrays or tensors) hashed over one whole digest; past
them the digest is incomplete (:class:`Findings` ``cut``). A torch module has about 19 (itself,
its ``__dict__`` and the dicts of its parameters, buffers, submodules and hooks): a step
holding a ResNet-50 has 2,936, hashed in 61 ms with its 100 MB of weights (32 MiB of them in
full, ``TOTAL_BYTES``; docs/design.md), so this bound is at most about 0.2 s (12 µs an
object). A step holding a training loop's object or a whole framework reaches more, and is not
keyed; so is one holding a container whose items are sampled (``TOTAL_ITEMS``)."""
CODE_ONLY = 1 << 20
"""Pass as ``depth`` for code without parameters (``fingerprint.source_code``): every state
counts by its type (numbers, strings and arrays still by value)."""
TOTAL_BYTES = 32 << 20
"""Bytes hashed in full over one whole digest, arrays, tensors and ``bytes`` together; once
spent, each further one counts by dtype, shape and about 64 evenly spaced elements
(``value_digest._SPENT_SAMPLE``). ``value_digest``'s bounds are each a container's or an
array's: they compounded, and a source holding 9,000 decoded images of
150 KB in a list (8,192 items, each hashed whole) took 0.86 s at every epoch's start (a
review). 32 MiB is about 25 ms of SHA-256 here."""
TOTAL_ITEMS = 1 << 10
"""Items of containers over ``value_digest.MAX_ITEMS`` hashed one by one over one whole
digest (each item costs 20-60 µs: 8,192 lists of 8,192 objects were otherwise 67 million
digests, and a list of 9,000 images 9,000). Plain scalars and records are hashed in one pass
and not counted here. A container whose items do not fit what is left (or that holds more
than ``value_digest.FULL_ITEMS``) is hashed whole in one pass, for the sample cache's keys,
when its items are plain values (``TOTAL_PLAIN``); else it counts by 64 evenly spaced items and its length, and the digest is
incomplete (:class:`Findings` ``cut``): a source holding 2,000 annotation dicts hashed 64 of
them, and the cache served old labels after 8 were changed (a review)."""
TOTAL_PLAIN = 512 << 20
"""Bytes of plain values (dicts, lists and tuples of ``None``, ``bool``, ``int``, ``float``,
``str``, ``bytes`` and NumPy values, nested at any depth) pickled and hashed over one whole
digest of the sample cache's keys (``digest_scope(complete=True)``) for containers that would
otherwise be sampled (``plain_digest.plain_digest``); checked after each 1,024 items, so one
digest pickles at most this plus one such chunk, and holds one chunk's bytes at a time. CPU
time here (2 cores shared with a test run): a Places365-size source of 1.8 million ``(path,
label)`` samples with 104-char paths (about 200 MB pickled) 0.25-0.4 s; 100,000 COCO
annotation dicts (29 MB; each dict rebuilt in sorted key order, ``plain_digest``) 0.28 s; this
budget spent on a container larger still (5.2 million such samples) 1.2 s, once per epoch's cache
plan, never per sample. 128 MiB left that source, and ImageNet's with a 102-char root, with no
cached form (a review). Past it, such a container counts by a sample and the digest is
incomplete (:class:`Findings` ``too_large``: a source's own ``fingerprint()`` keys it)."""
_SCOPE = threading.local()
"""``current``: the running whole digest's :class:`_Scope` (absent or None: none running in
this thread)."""


def module_name(obj: Any) -> str:
    """``obj.__module__`` with the training script's two names (``__main__`` in the process
    that runs it, ``__mp_main__`` in a ``spawn`` child) made one."""
    mod = str(getattr(obj, "__module__", None) or "?")
    return "__main__" if mod == "__mp_main__" else mod


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a function or class, the same in every process."""
    return f"{module_name(obj)}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def short_hash(data: bytes) -> str:
    """The first 12 hex digits of the SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()[:12]


@dataclasses.dataclass
class Findings:
    """What one whole digest met besides values (:func:`digest_scope`)."""

    generator: str | None = None
    """Qualified type of the first random generator reached (a step holding one may draw from
    it: its output may differ from one epoch to the next)."""
    cut: str | None = None
    """Why some state reached was not hashed, in words (None: all of it was, but for arrays,
    tensors and ``bytes`` past the byte bounds, which count by a sample of their elements):
    the digest then does not tell that state apart. Only the sample cache insists on a whole
    digest (``cache/tiers.py``); a stored profile's key and a state dict's step identities
    take the digest as it is."""
    too_large: bool = False
    """Whether ``cut`` is a container of plain values past ``TOTAL_PLAIN`` (hashing it whole
    was possible, but costs more than one epoch's plan may take)."""


class _Scope:
    """The running whole digest: its budgets, its path and what it found."""

    __slots__ = ("complete", "found", "left", "nodes", "path", "pickled")

    def __init__(self, complete: bool) -> None:
        self.complete = complete
        """Whether a container is hashed whole in one pass where it would be sampled
        (:func:`digest_scope`)."""
        self.left = [TOTAL_BYTES, TOTAL_ITEMS, TOTAL_PLAIN]
        """[bytes, items, plain bytes] it may still hash in full."""
        self.nodes = TOTAL_NODES
        """Objects and containers it may still follow."""
        self.path: dict[int, int] = {}
        """``id`` of each object being hashed, up the path from the one hashed now -> its
        place on the path (0: outermost)."""
        self.found = Findings()
        self.pickled: dict[int, tuple[Any, str]] = {}
        """``id`` of each container hashed whole in one pass -> (it, its digest): one held twice
        (torchvision's ``ImageFolder`` holds its list of samples as ``samples`` and ``imgs``)
        is pickled once."""


@contextlib.contextmanager
def digest_scope(complete: bool = False) -> Iterator[Findings]:
    """One whole digest: the ``state_digest`` and ``code_identity`` calls inside share one
    budget (``TOTAL_BYTES``, ``TOTAL_ITEMS``, ``TOTAL_PLAIN``, ``TOTAL_NODES``) and one path
    (cycles), and report what they met in the :class:`Findings` yielded. A scope opened inside
    another is a new whole digest; the outer one goes on after it.

    ``complete`` (the sample cache's keys, ``cache/tiers.py``): a container that would be
    sampled is hashed whole when its items are plain values (``TOTAL_PLAIN``). Without it (a
    state dict's step identities, a stored profile's key: a sample there costs a warning or a
    profile, not stale samples) such a container counts by its sample, as before, at no more
    cost; either way a sample is recorded (``Findings.cut``)."""
    outer = getattr(_SCOPE, "current", None)
    scope = _SCOPE.current = _Scope(complete)
    try:
        yield scope.found
    finally:
        _SCOPE.current = outer


def running() -> bool:
    """Whether a whole digest runs in this thread (:func:`digest_scope`)."""
    return getattr(_SCOPE, "current", None) is not None


def guarded(digest: Any, value: Any, depth: int) -> str:
    """``digest(value, depth)`` as the outermost call of a whole digest: a
    ``RecursionError`` (a caller already deep in its stack) makes it incomplete
    (:class:`Findings` ``cut``), not a failure."""
    try:
        return str(digest(value, depth))
    except RecursionError:
        note_cut("the interpreter's recursion limit was reached")
        return short_hash(f"cut:{qualified_name(type(value))}".encode())


def note_cut(why: str, too_large: bool = False) -> None:
    """Record that the running digest left state out (the first reason is kept), and whether
    it was plain values past ``TOTAL_PLAIN`` (:class:`Findings` ``too_large``)."""
    found = _SCOPE.current.found
    if found.cut is None:
        found.cut, found.too_large = why, too_large


def enter(value: Any) -> str | None:
    """Put object ``value`` on the running digest's path before hashing its state: ``None``,
    or the digest it gets instead: a cycle's (it is on the path already: by the distance up to
    it, as its state is being hashed there), or an incomplete digest's past ``MAX_NESTING`` or
    ``TOTAL_NODES``. A ``None`` is paired with :func:`leave`."""
    scope = _SCOPE.current
    depth = len(scope.path)
    seen = scope.path.get(id(value))
    if seen is not None:
        return short_hash(f"cycle{depth - seen}:{qualified_name(type(value))}".encode())
    if depth >= MAX_NESTING or scope.nodes <= 0:
        note_cut(f"more than {MAX_NESTING} objects nested" if depth >= MAX_NESTING
                 else f"more than {TOTAL_NODES} objects")
        return short_hash(f"cut:{qualified_name(type(value))}".encode())
    scope.nodes -= 1
    scope.path[id(value)] = depth
    return None


def leave(value: Any) -> None:
    """Take ``value`` off the running digest's path (after :func:`enter` gave ``None``)."""
    _SCOPE.current.path.pop(id(value), None)


def on_path(value: Any, digest: Callable[[Any, int], str], depth: int) -> str:
    """``digest(value, depth)`` with ``value`` on the running digest's path (:func:`enter`,
    :func:`leave`), or the digest :func:`enter` gives instead (a cycle, a cut)."""
    instead = enter(value)
    if instead is not None:
        return instead
    try:
        return digest(value, depth)
    finally:
        leave(value)


def generator_kind(value: Any) -> str | None:
    """The qualified type of ``value`` if it is a random generator (``random.Random`` and its
    subclasses, NumPy's ``Generator``, ``RandomState``, ``BitGenerator``, a
    ``torch.Generator``), else None."""
    import numpy as np

    torch = sys.modules.get("torch")
    if isinstance(value, (random.Random, np.random.Generator, np.random.RandomState,
                          np.random.BitGenerator)) or (
            torch is not None and isinstance(value, torch.Generator)):
        return qualified_name(type(value))
    return None


def note_generator(kind: str) -> None:
    """Record that the running digest reached a random generator of type ``kind``."""
    found = _SCOPE.current.found
    if found.generator is None:
        found.generator = kind


def spend(nbytes: int = 0, items: int = 0, plain: int = 0) -> bool:
    """Take ``nbytes``, ``items`` and ``plain`` bytes from the running digest's budget (only
    called inside a whole digest): False (nothing taken) when it has not that much left."""
    left = _SCOPE.current.left
    if left[0] < nbytes or left[1] < items or left[2] < plain:
        return False
    left[0] -= nbytes
    left[1] -= items
    left[2] -= plain
    return True


def left_plain() -> int:
    """Bytes of ``TOTAL_PLAIN`` the running digest has left."""
    return int(_SCOPE.current.left[2])


def whole_digest(items: Any) -> str | None:
    """The digest the running digest already gave container ``items`` in one pass, if any."""
    seen = _SCOPE.current.pickled.get(id(items))
    return seen[1] if seen is not None and seen[0] is items else None


def note_whole(items: Any, digest: str) -> None:
    """Record that container ``items`` was hashed whole in one pass, as ``digest``."""
    _SCOPE.current.pickled[id(items)] = (items, digest)


def wants_complete() -> bool:
    """Whether the running digest hashes whole what it would sample (:func:`digest_scope`)."""
    return bool(_SCOPE.current.complete)
