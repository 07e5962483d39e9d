"""Stable fingerprints of steps, sources and pipelines: same code and order -> same hex string.

Stable across processes: a step counts by its code's identity (:mod:`code_digest`) and
traits, a source by its own ``fingerprint()``, else its class's code (:func:`source_code`) and,
for the cache, its state by value (:mod:`value_digest`);
both name the training script ``__main__`` in every process and never hash through a ``repr``
that may hold a memory address. Fingerprints decide which stored
profile a run reuses and which steps a resume reports as changed; they never refuse a resume
(``runtime/checkpoint.py`` decides that from lengths and batch layout).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from headrace.pipeline.code_digest import code_identity
from headrace.pipeline.digest_scope import CODE_ONLY, qualified_name, short_hash
from headrace.pipeline.inplace import compose_parts
from headrace.pipeline.source import DatasetSource, Files, user_attr
from headrace.pipeline.timed import unwrapped
from headrace.pipeline.value_digest import state_digest

if TYPE_CHECKING:
    from headrace.pipeline.pipeline import Pipeline

def step_digests(p: Pipeline) -> dict[str, str]:
    """Step name (``name#2`` for a name's second use) -> digest of its traits and code, in the
    pipeline's order, for saying which steps changed."""
    out: dict[str, str] = {}
    for s in p.steps:
        key, k = s.name, 1
        while key in out:
            k += 1
            key = f"{s.name}#{k}"
        out[key] = short_hash(
            f"{s.random}|{s.keep_position}|{s.kind}|{s.commutes}|{code_identity(s.fn)}".encode())
    return out


def pipeline_fingerprint(p: Pipeline, stateless: bool = False) -> str:
    """Hash of step names, traits, code identities (in order) and the source identity
    (:func:`source_fingerprint`; with ``stateless``, :func:`profile_identity`)."""
    h = hashlib.sha256()
    for name, digest in step_digests(p).items():
        h.update(f"{name}|{digest}".encode())
        h.update(b"\x00")
    h.update((profile_identity(p.source) if stateless else source_fingerprint(p.source)).encode())
    return h.hexdigest()[:16]


def profile_identity(source: Any) -> str:
    """The source's identity in the profile store's key: :func:`source_fingerprint`, except
    for headrace's own :class:`Files`, which counts as a plain dataset does (its class, length
    and code), not by its ``fingerprint()``: that is the cache's identity of the file set (its
    root and every file's modification time), and a job whose files were staged to a scratch
    directory, or one of whose files was touched, measured its warm-up again (a bug hunt).
    A ``Files`` subclass with a ``fingerprint()`` of its own keeps it."""
    if isinstance(source, Files) and type(source).fingerprint is Files.fingerprint:
        return _by_code(source)
    return source_fingerprint(source)


def source_fingerprint(source: Any, content: bool = False) -> str:
    """The source's own ``fingerprint()`` if it has one, else its type, length and code
    (:func:`source_code`); with ``content``, also its state by value at any depth, as a step's
    parameters (:func:`state_digest` of its attributes: the paths it reads, its arrays by their bytes, a large one by a sample or the
    file it is mapped from, its transforms' code and parameters; :mod:`value_digest` says
    what is hashed in full). A map-style dataset wrapped as a source (``DatasetSource``) counts as the
    dataset.

    Without ``content`` (a state dict's record of the dataset, the profile store), two datasets
    of one class, code and length match, whatever their state (a root path, held arrays). The
    sample cache keys its entries ``content``: a cache shared through Redis otherwise served a
    job over ``Images("/data/a")`` the samples of a job over ``Images("/data/b")`` of the same
    length. The cache takes it at every epoch's plan (``cache/session.py``): a source the
    script changes between epochs gets other entries."""
    if content and isinstance(source, DatasetSource):
        return f"{source_fingerprint(source.dataset, content)}:{bool(source._many)}"
    fp = user_attr(source, "fingerprint")
    if callable(fp):
        return str(fp())
    if content:  # its transform's code counts in its state, with the transform's parameters
        return f"{_typed_length(source)}:{_classes_code(source)}:{state_digest(source, 1)}"
    return _by_code(source)


def _by_code(source: Any) -> str:
    """Identity without state: type, length and code (:func:`source_code`)."""
    return f"{_typed_length(source)}:{source_code(source)}"


def _typed_length(source: Any) -> str:
    try:
        n: int | str = len(source)
    except Exception:  # noqa: BLE001 - no __len__, or one that raises (Pipeline.length)
        n = "?"
    return f"{qualified_name(type(source))}:{n}"


def source_code(source: Any, depth: int = 0) -> str:
    """Digest of the code of ``source``'s class (:func:`_class_code`) and, for a dataset with a
    ``transform``, of that transform's code without its parameters (a Compose-like one: its
    class's and each of its transforms'). Two datasets of one class name and length,
    ``__main__.DS`` in two scripts, or a script's ``DS`` before and after its ``__getitem__``
    was edited, shared a stored profile: a dataset returning 600 KB samples skipped its warm-up
    with the profile of one returning 16 B (a bug hunt)."""
    parts = [_class_code(source)]
    tf = user_attr(source, "transform")
    if callable(tf):
        members = compose_parts(tf) or []
        parts += [code_identity(unwrapped(t), CODE_ONLY) for t in [tf, *members]]
    parts += [source_code(d, depth + 1) for d in wrapped(source, depth)]
    return short_hash(";".join(parts).encode())


def wrapped(source: Any, depth: int = 0) -> list[Any]:
    """The datasets ``source`` wraps (torch's ``Subset``, what ``random_split`` returns, holds
    one as ``dataset``; ``ConcatDataset`` several as ``datasets``, the first ``_MAX_WRAPPED``
    of them: their code, not their state), at most ``_WRAPS`` levels down: a wrapper's class is torch's, so counting only it let two scripts' datasets behind a
    ``Subset`` share a stored profile and a cache namespace (a review)."""
    import torch.utils.data as tud

    if depth >= _WRAPS:
        return []

    def dataset(x: Any) -> bool:  # torch's, or any indexable object not a plain container
        t = type(x)
        return isinstance(x, tud.Dataset) or (
            hasattr(t, "__getitem__") and hasattr(t, "__len__")
            and t.__module__.partition(".")[0] not in ("builtins", "numpy", "torch"))

    inner = user_attr(source, "dataset")
    found = [inner] if dataset(inner) else []
    many = user_attr(source, "datasets")
    if isinstance(many, (list, tuple)):
        found += [d for d in many[:_MAX_WRAPPED] if dataset(d)]
    return found


_WRAPS = 4
"""Levels of wrapping (a ``Subset`` of a ``ConcatDataset`` of ...) :func:`wrapped` follows."""
_MAX_WRAPPED = 64
"""Datasets of a ``ConcatDataset`` whose classes' code :func:`wrapped` follows (a bound on code
followed; their state counts in full by content)."""


def _classes_code(source: Any, depth: int = 0) -> str:
    """:func:`_class_code` of ``source`` and of the datasets it wraps (:func:`wrapped`)."""
    inner = wrapped(source, depth)
    if not inner:
        return _class_code(source)
    return short_hash(";".join([_class_code(source),
                                *(_classes_code(d, depth + 1) for d in inner)]).encode())


def _class_code(source: Any) -> str:
    """The code of the functions ``source``'s class and its bases define, with their default
    arguments (:func:`code_identity` of the class one level down: a step's rule for a class it
    uses), not the module globals they read: the names of a script's ``__main__`` block
    (``full = ...`` beside ``np.full`` in ``__getitem__``) are globals where the script saves
    a state dict and not in a ``spawn`` child resuming it, which was told the dataset
    changed."""
    return code_identity(type(source), 1)
