"""Stable fingerprints of steps, sources and pipelines: same code and order -> same hex string.

Stable across processes: a class defined in the training script is ``__main__.X`` in the
process that runs it and ``__mp_main__.X`` in a ``spawn`` child, and both name it ``__main__``
here; object state is hashed by value (arrays by their bytes, nested objects by their own
state), never through a ``repr`` that may hold a memory address. Fingerprints decide which stored
profile a run reuses and which steps a resume reports as changed; they never refuse a resume
(``runtime/checkpoint.py`` decides that from lengths and batch layout).
"""

from __future__ import annotations

import hashlib
import inspect
from typing import TYPE_CHECKING, Any

from headrace.pipeline.source import user_attr

if TYPE_CHECKING:
    from headrace.pipeline.pipeline import Pipeline

_MAX_DEPTH = 4
"""Nesting levels of object state hashed; deeper state counts by its type only."""
_MAX_ITEMS = 64
"""Elements of a list, tuple, set or dict hashed; longer ones count by length beyond that."""


def module_name(obj: Any) -> str:
    """``obj.__module__`` with the training script's two names (``__main__`` in the process
    that runs it, ``__mp_main__`` in a ``spawn`` child) made one."""
    mod = str(getattr(obj, "__module__", None) or "?")
    return "__main__" if mod == "__mp_main__" else mod


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a function or class, the same in every process."""
    return f"{module_name(obj)}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _h(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def _code_digest(code: Any) -> str:
    parts = [code.co_code]
    for c in code.co_consts:
        parts.append(_code_digest(c).encode() if inspect.iscode(c) else repr(c).encode())
    return _h(b"\x00".join(parts))


def state_digest(value: Any, depth: int = 0) -> str:
    """A digest of ``value`` by content: numbers, strings and bytes by value, arrays and
    tensors by dtype, shape and bytes, containers element by element, callables by
    :func:`code_identity`, other objects by class and ``__dict__``."""
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return _h(repr(value).encode())
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _h(bytes(value))
    if isinstance(value, np.ndarray):
        return _h(f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        arr = value.detach().cpu().contiguous()
        return _h(f"{arr.dtype}{tuple(arr.shape)}".encode() + arr.numpy().tobytes())
    if depth >= _MAX_DEPTH:
        return _h(qualified_name(type(value)).encode())
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
        inner = [state_digest(v, depth + 1) for v in items[:_MAX_ITEMS]]
        return _h(f"{type(value).__name__}{len(items)}:{','.join(inner)}".encode())
    if isinstance(value, dict):
        keys = sorted(value, key=repr)[:_MAX_ITEMS]
        inner = [f"{state_digest(k, depth + 1)}={state_digest(value[k], depth + 1)}" for k in keys]
        return _h(f"dict{len(value)}:{','.join(inner)}".encode())
    if callable(value):
        return _h(code_identity(value, depth + 1).encode())
    state = getattr(value, "__dict__", None)
    name = qualified_name(type(value))
    if isinstance(state, dict):
        return _h(f"{name}:{state_digest(state, depth + 1)}".encode())
    return _h(name.encode())


def code_identity(fn: Any, depth: int = 0) -> str:
    """Identity of a callable's code: qualified name plus bytecode and constants when available.

    Callable objects are identified by their class, its ``__call__`` code and their state by
    value, so two ``Resize(224)`` instances match and ``Resize(256)`` does not. Closures count
    the values they captured.
    """
    code = getattr(fn, "__code__", None)
    if code is not None:
        ident = f"{qualified_name(fn)}:{_code_digest(code)}"
        cells = getattr(fn, "__closure__", None) or ()
        if cells and depth < _MAX_DEPTH:
            captured = []
            for c in cells:
                try:
                    captured.append(state_digest(c.cell_contents, depth + 1))
                except ValueError:  # an empty cell
                    captured.append("-")
            ident += ":" + _h(",".join(captured).encode())
        return ident
    if inspect.isclass(type(fn)) and not inspect.isfunction(fn):
        cls = type(fn)
        ident = qualified_name(cls)
        call_code = getattr(cls.__dict__.get("__call__"), "__code__", None) or getattr(
            getattr(cls, "__call__", None), "__code__", None)  # noqa: B004 - the class's method
        if call_code is not None:
            ident += ":" + _code_digest(call_code)
        state = getattr(fn, "__dict__", None)
        if state and depth < _MAX_DEPTH:
            ident += ":" + state_digest(state, depth + 1)
        return ident
    return qualified_name(fn)


def step_digests(p: Pipeline) -> dict[str, str]:
    """Step name (``name#2`` for a name's second use) -> digest of its traits and code, in the
    pipeline's order, for saying which steps changed."""
    out: dict[str, str] = {}
    for s in p.steps:
        key, k = s.name, 1
        while key in out:
            k += 1
            key = f"{s.name}#{k}"
        out[key] = _h(
            f"{s.random}|{s.keep_position}|{s.kind}|{s.commutes}|{code_identity(s.fn)}".encode())
    return out


def pipeline_fingerprint(p: Pipeline) -> str:
    """Hash of step names, traits, code identities (in order) and the source identity."""
    h = hashlib.sha256()
    for name, digest in step_digests(p).items():
        h.update(f"{name}|{digest}".encode())
        h.update(b"\x00")
    h.update(source_fingerprint(p.source).encode())
    return h.hexdigest()[:16]


def source_fingerprint(source: Any) -> str:
    """The source's own ``fingerprint()`` if it has one, else its type and length."""
    fp = user_attr(source, "fingerprint")
    if callable(fp):
        return str(fp())
    try:
        n: int | str = len(source)
    except TypeError:  # a map-style dataset without __len__
        n = "?"
    return f"{qualified_name(type(source))}:{n}"
