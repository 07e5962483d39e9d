"""Sources: where raw samples come from, by index."""

from __future__ import annotations

import fnmatch
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from headrace.errors import PipelineError


def user_attr(obj: Any, name: str) -> Any:
    """``getattr(obj, name, None)`` on a user's object, also where its ``__getattr__`` raises
    something other than ``AttributeError`` (a dataset forwarding names to its columns raises
    ``KeyError``): torch never reads these names, so their absence must not fail."""
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - not an attribute we can use
        return None


@runtime_checkable
class Source(Protocol):
    """Raw samples by index. ``load`` must be deterministic and safe to call in any process."""

    def __len__(self) -> int: ...

    def load(self, index: int) -> Any: ...


_FILES_FINGERPRINTS: weakref.WeakKeyDictionary[Files, tuple[Any, ...]] = \
    weakref.WeakKeyDictionary()
"""A ``Files`` source -> (its root, paths list and length, fingerprint) as first taken in this
process; kept out of the object, whose state a pickle or a content digest reads."""


class Files:
    """Raw bytes of the files under ``root`` matching ``pattern``, sorted by relative path.

    ``load(i)`` returns ``bytes``. The listing is taken once, at construction, and so is the
    fingerprint, once per process (see :meth:`fingerprint`).
    """

    def __init__(self, root: str | os.PathLike[str], pattern: str = "*") -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise PipelineError(f"Files source: {self.root} is not a directory")
        self.pattern = pattern
        paths: list[str] = []
        for dirpath, _dirs, names in os.walk(self.root):
            for n in names:
                if fnmatch.fnmatch(n, pattern):
                    paths.append(os.path.relpath(os.path.join(dirpath, n), self.root))
        paths.sort()
        if not paths:
            raise PipelineError(f"Files source: no file under {self.root} matches {pattern!r}")
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, index: int) -> bytes:
        with open(self.root / self.paths[index], "rb") as f:
            return f.read()

    def fingerprint(self) -> str:
        """Identity of the file set: its root, and each file's name, size and modification time
        (``st_mtime_ns``), as rsync's quick check. Content is not read: two roots holding files
        of the same names and sizes shared a cache's entries, and files rewritten with other
        bytes of the same size were served the old files' entries. A rewrite that keeps the
        time (within the file system clock's tick of the last write, or ``touch -r``) is not
        told apart; a copy that does not keep times (``cp`` without ``-p``) is another set.

        Taken once per object in a process, and kept while ``root`` and ``paths`` are the same
        objects of the same length: it stats every file (0.1 s for 20,000, seconds for
        ImageNet's 1.28 million), and it was taken again at every ``state_dict()`` and every
        epoch's cache plan. A running job's file set counts as fixed; a new process (a resume,
        the next job) takes it afresh, and that is where a rewritten file set is seen."""
        import hashlib

        key = (self.root, self.paths, len(self.paths))
        try:
            kept = _FILES_FINGERPRINTS.get(self)
        except TypeError:  # a subclass without __hash__ (an __eq__ of its own): not kept
            kept = None
        if kept is not None and kept[0] is key[0] and kept[1] is key[1] and kept[2] == key[2]:
            return str(kept[3])
        h = hashlib.sha256(str(self.root.resolve()).encode())
        for p in self.paths:
            st = (self.root / p).stat()
            h.update(f"{p}\x00{st.st_size}\x00{st.st_mtime_ns}\x00".encode())
        fp = h.hexdigest()[:16]
        try:
            _FILES_FINGERPRINTS[self] = (*key, fp)
        except TypeError:
            pass
        return fp


GETITEMS_DIFFERENCE = (
    "README, Differences from torch's DataLoader: \"`__getitems__` is asked for one sample at a "
    "time\""
)
"""Where the README says why headrace asks ``__getitems__`` for batches of one."""


def only_sample(got: Any, index: int) -> Any:
    """The one sample in ``got``, what a dataset's ``__getitems__([index])`` returned: a
    sequence of one sample per index (torch's fetcher hands that list to ``collate_fn``). A
    ``TypeError`` saying what it returned where it is not that: taking ``got[0]`` of a batch
    of columns (``{"x": [...]}``, Hugging Face's form) raised ``KeyError: 0``, which named
    neither ``__getitems__`` nor what it returned, and a longer answer gave its first element
    without a word. An answer without ``len()`` is indexed, as before."""
    try:
        n = len(got)
    except Exception:  # noqa: BLE001 - no len(): what [0] gives, as before
        n = 1
    if n == 1:
        try:
            return got[0]
        except (KeyError, IndexError, TypeError) as e:  # columns (KeyError: 0), None, a set:
            if not isinstance(got, Mapping) and got is not None and not isinstance(e, TypeError):
                raise  # a lazy batch's own error reading its sample: the dataset's, as it is
            # else headrace's own [0] of a wrong answer (its KeyError: 0 would mislead): below
    raise TypeError(
        f"the dataset's __getitems__([{index}]) returned {_described(got)}, not a sequence "
        "holding that one sample: headrace asks __getitems__ for one sample at a time "
        "(workers, the slow lane and exact resume count samples) and needs a list of one "
        "sample per index, the form torch's default_collate takes. Return a list of samples "
        f"(a collate_fn that took columns then gets that list; {GETITEMS_DIFFERENCE})"
    ) from None


def _described(got: Any) -> str:
    """``got``'s type, and its keys or length where it has them (for an error message)."""
    kind = type(got).__qualname__
    if isinstance(got, Mapping):
        keys = list(got)[:8]
        return f"a {kind} with keys {keys}{' ...' if len(got) > 8 else ''} (columns?)"
    try:
        return f"a {kind} of length {len(got)}"
    except Exception:  # noqa: BLE001 - no len()
        return f"a {kind}"


class DatasetSource:
    """A map-style dataset seen as a source: ``load(i) = dataset[i]``, or
    ``dataset.__getitems__([i])[0]`` when the dataset has ``__getitems__`` and ``batched``
    (torch's fetcher calls ``__getitems__`` with a batch's indices when it batches: a dataset
    may define only that, or answer it otherwise; headrace fetches sample by sample, so it asks
    for batches of one)."""

    def __init__(self, dataset: Any, batched: bool = True) -> None:
        self.dataset = dataset
        many = getattr(dataset, "__getitems__", None) if batched else None
        self._many = many if callable(many) else None

    def __len__(self) -> int:
        return len(self.dataset)

    def load(self, index: int) -> Any:
        if self._many is not None:
            return only_sample(self._many([index]), index)
        return self.dataset[index]

    def fingerprint(self) -> str:
        """The dataset's own ``fingerprint()``, else its type, length and code."""
        from headrace.pipeline.fingerprint import source_fingerprint

        return source_fingerprint(self.dataset)
