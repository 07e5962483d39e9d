"""Python's and NumPy's global generators where a sampler draws its order from them.

A length-bucketing batch sampler shuffles with ``random.shuffle`` or ``np.random.permutation``;
torch's loader leaves those generators to the user, and so did headrace's state dict, which
replays the order from the torch generators alone (``runtime/checkpoint.py``). In any epoch but
a first seeded one, the resumed process's global generators were elsewhere than at the saved
epoch's start: the replayed order was another, and the resumed epoch delivered some samples
twice and others never, without a word.

So the epoch's start (``runtime/drawing.py``) takes both generators' states before it reads
the sampler and, where the read moved one, keeps that one's state before it (:class:`HostRngs`);
a replay puts those in place around the same read and gives the training loop its own states
back afterwards, as it does for torch's global generator. Samplers that leave them alone (every
torch sampler) add nothing to the state dict. A sampler drawing from them lazily, element after
element past its first, is not replayed (nor is one drawing from torch's lazily).
"""

from __future__ import annotations

import base64
import dataclasses
import random
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class HostRngs:
    """The states, before a sampler read, of the global generators that read moved
    (``None``: not moved): ``python`` as ``random.getstate()`` gives it, ``numpy`` as
    ``np.random.get_state(legacy=False)`` does."""

    python: Any = None
    numpy: Any = None


Snapshot = tuple[Any, Any]


def snapshot() -> Snapshot:
    """Both generators' states now (about 30 µs; taken once per epoch)."""
    return random.getstate(), np.random.get_state(legacy=False)


def moved_since(before: Snapshot) -> HostRngs | None:
    """The states in ``before`` of the generators that moved since (None: neither did)."""
    now = snapshot()
    python = before[0] if now[0] != before[0] else None
    numpy_ = before[1] if not _same(now[1], before[1]) else None
    return None if python is None and numpy_ is None else HostRngs(python, numpy_)


def put(saved: HostRngs | None) -> Snapshot | None:
    """Set the generators ``saved`` holds; the states they had (for :func:`give_back`)."""
    if saved is None:
        return None
    mine = snapshot()
    if saved.python is not None:
        random.setstate(saved.python)
    if saved.numpy is not None:
        np.random.set_state(saved.numpy)
    return mine


def give_back(mine: Snapshot | None) -> None:
    """Put back the states :func:`put` took."""
    if mine is not None:
        random.setstate(mine[0])
        np.random.set_state(mine[1])


def to_dict(h: HostRngs | None) -> dict[str, Any] | None:
    """``h`` for a state dict: JSON-friendly, and plain data for ``torch.load(weights_only=True)``
    (no pickle)."""
    if h is None:
        return None
    out: dict[str, Any] = {}
    if h.python is not None:
        version, words, gauss = h.python
        out["python"] = {"version": version, "gauss": gauss,
                         "words": _b64(np.asarray(words, dtype=np.uint32))}
    if h.numpy is not None:
        out["numpy"] = _encode(h.numpy)
    return out


def from_dict(d: dict[str, Any] | None) -> HostRngs | None:
    """The inverse of :func:`to_dict` (``None`` in a state dict saved before it)."""
    if not d:
        return None
    python = None
    if d.get("python") is not None:
        p = d["python"]
        words = tuple(int(w) for w in _array(p["words"]))
        python = (p["version"], words, p["gauss"])
    numpy_ = _decode(d["numpy"]) if d.get("numpy") is not None else None
    return HostRngs(python, numpy_)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def _b64(a: np.ndarray) -> dict[str, Any]:
    return {"dtype": a.dtype.str, "shape": list(a.shape),
            "data": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")}


def _array(d: dict[str, Any]) -> np.ndarray:
    raw = base64.b64decode(d["data"])
    return np.frombuffer(raw, dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def _encode(x: Any) -> Any:
    """NumPy's state (nested dicts of ints, floats, strings and arrays), arrays as base64."""
    if isinstance(x, dict):
        return {k: _encode(v) for k, v in x.items()}
    if isinstance(x, np.ndarray):
        return {"ndarray": _b64(x)}
    if isinstance(x, np.generic):
        return x.item()
    return x


def _decode(x: Any) -> Any:
    if isinstance(x, dict):
        if set(x) == {"ndarray"}:
            return _array(x["ndarray"])
        return {k: _decode(v) for k, v in x.items()}
    return x
