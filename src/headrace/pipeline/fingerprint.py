"""Stable fingerprints of steps and pipelines: same code and order -> same hex string."""

from __future__ import annotations

import hashlib
import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headrace.pipeline.pipeline import Pipeline


def code_identity(fn: Any) -> str:
    """Identity of a callable's code: qualified name plus bytecode and constants when available.

    Callable objects are identified by their class and their picklable state, so two
    ``Resize(224)`` instances match and ``Resize(256)`` does not.
    """
    inner = getattr(fn, "fn", None)
    if inner is not None and callable(inner) and type(fn).__name__ == "_OnInput":
        return "on_input:" + code_identity(inner)
    code = getattr(fn, "__code__", None)
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    if code is not None:
        return f"{name}:{hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:12]}"
    if inspect.isclass(type(fn)) and not inspect.isfunction(fn):
        state = getattr(fn, "__dict__", None)
        cls = type(fn)
        ident = f"{cls.__module__}.{cls.__qualname__}"
        try:
            call_code = cls.__call__.__code__
            ident += ":" + hashlib.sha256(call_code.co_code).hexdigest()[:12]
        except AttributeError:
            pass
        if state:
            ident += ":" + hashlib.sha256(repr(sorted(state.items(), key=str)).encode()).hexdigest()[:12]
        return ident
    return name


def pipeline_fingerprint(p: Pipeline) -> str:
    """Hash of step names, traits, code identities (in order) and the source identity."""
    h = hashlib.sha256()
    for s in p.steps:
        h.update(f"{s.name}|{s.random}|{s.keep_position}|{s.kind}|{s.commutes}|".encode())
        h.update(code_identity(s.fn).encode())
        h.update(b"\x00")
    h.update(source_fingerprint(p.source).encode())
    return h.hexdigest()[:16]


def source_fingerprint(source: Any) -> str:
    """The source's own ``fingerprint()`` if it has one, else its type and length."""
    fp = getattr(source, "fingerprint", None)
    if callable(fp):
        return str(fp())
    return f"{type(source).__module__}.{type(source).__qualname__}:{len(source)}"
