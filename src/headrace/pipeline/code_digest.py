"""The identity of a step's code, the same in every process: a function by its bytecode, the
names it uses, its constants, defaults, captured values and the module globals it reads; a
callable object by its class's methods and its state; a module it calls into by its source
(:mod:`modules`).

The state of the objects reached (bound arguments, captured values, an object's attributes)
counts by :func:`value_digest.state_digest`, which counts a callable inside a value by
:func:`code_identity` again: this module imports ``value_digest`` at its top, ``value_digest``
this one inside ``state_digest`` (a local import).
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

from headrace.pipeline.modules import module_digest, package_version
from headrace.pipeline.value_digest import (
    MAX_DEPTH,
    MAX_ITEMS,
    dictless_state,
    module_name,
    qualified_name,
    short_hash,
    state_digest,
)

_LIBRARIES = frozenset({"torch", "numpy"}) | frozenset(sys.stdlib_module_names)
"""Top-level packages whose classes count by the package's version, not by their methods'
code (:func:`_methods_digest`): a transform subclassing ``nn.Module`` would otherwise hash its
hundreds of methods at every fingerprint."""


def _code_digest(code: Any) -> str:
    """Bytecode, the names it uses (``co_names``: globals and attributes, so ``x.mean()`` and
    ``x.max()`` differ) and its constants, nested code objects included."""
    parts = [code.co_code, ",".join(code.co_names).encode()]
    for c in code.co_consts:
        parts.append(_code_digest(c).encode() if inspect.iscode(c) else repr(c).encode())
    return short_hash(b"\x00".join(parts))


def code_identity(fn: Any, depth: int = 0) -> str:
    """Identity of a callable's code: qualified name plus bytecode and constants when available.

    Callable objects are identified by their class, the code of every method it and its bases
    define (:func:`_methods_digest`: the helper methods its ``__call__`` calls too) and their
    state by value (``__dict__``, else ``__slots__`` or what pickle rebuilds them from), so two
    ``Resize(224)`` instances match and ``Resize(256)`` does not. Closures count the values
    they captured. A ``functools.partial`` is its function's identity plus its bound arguments
    and keywords by value (nested partials likewise), and a bound method is its function, its
    class's methods and the object it is bound to, so ``partial(scale, factor=2)`` and
    ``partial(scale, factor=3)``, or ``Scaler(2).apply`` and ``Scaler(3).apply``, differ. A
    built-in function is its qualified name (``builtins.abs``,
    ``torch._VariableFunctionsClass.flatten``) plus the object it is bound to, if any; a class
    is its qualified name and its methods' code.
    """
    if isinstance(fn, functools.partial):
        ident = (f"{qualified_name(type(fn))}({code_identity(fn.func, depth)}"
                 f";{state_digest(fn.args, depth + 1)};{state_digest(fn.keywords, depth + 1)})")
        state = getattr(fn, "__dict__", None)
        if state and depth < MAX_DEPTH:
            ident += ":" + state_digest(state, depth + 1)
        return ident
    if inspect.ismethod(fn) or inspect.isbuiltin(fn):
        owner = fn.__self__
        ident = code_identity(fn.__func__, depth) if inspect.ismethod(fn) else qualified_name(fn)
        if owner is None or inspect.ismodule(owner):  # a plain built-in function
            return ident
        if inspect.ismethod(fn):  # the methods it calls on its object (self._helper)
            ident += ":" + _methods_digest(owner if inspect.isclass(owner) else type(owner), depth)
        return f"{ident}@{state_digest(owner, depth)}"
    if inspect.isclass(fn):
        return f"{qualified_name(fn)}:{_methods_digest(fn, depth)}"
    code = getattr(fn, "__code__", None)
    if code is not None:
        ident = f"{qualified_name(fn)}:{_code_digest(code)}"
        defaults = (getattr(fn, "__defaults__", None), getattr(fn, "__kwdefaults__", None))
        if defaults != (None, None):  # ``lambda x, k=k: ...``, ``def decode(x, k=2)``
            ident += ":" + state_digest(defaults, depth + 1)
        if depth == 0:  # the step's own function: the module globals it reads, by value
            ident += ":" + _globals_digest(getattr(fn, "__globals__", None), [code],
                                           module_name(fn))
        cells = getattr(fn, "__closure__", None) or ()
        if cells and depth < MAX_DEPTH:
            captured = []
            for c in cells:
                try:
                    captured.append(state_digest(c.cell_contents, depth + 1))
                except ValueError:  # an empty cell
                    captured.append("-")
            ident += ":" + short_hash(",".join(captured).encode())
        return ident
    cls = type(fn)
    ident = f"{qualified_name(cls)}:{_methods_digest(cls, depth)}"
    if depth >= MAX_DEPTH:
        return ident
    state = getattr(fn, "__dict__", None)
    rest = (state_digest(state, depth + 1) if state else None) if isinstance(state, dict) \
        else dictless_state(fn, depth + 1)
    return ident + (f":{rest}" if rest is not None else "")


def _methods_digest(cls: type, depth: int) -> str:
    """The code of the functions ``cls`` and its bases define (methods, static and class
    methods, properties' accessors), each with its default arguments; bases from
    ``_LIBRARIES`` (``nn.Module``, ``object``) count by their package's version instead. At
    ``depth`` 0 (the step itself), also the modules, functions and classes these functions
    reference, as a step function's, but not other globals' values: a method filling a
    module-level memo table changed the step's identity as it ran (the cache stopped hitting,
    a resume said the step changed). A callable class counted its ``__call__`` only: an edited
    helper method it calls (``self._go``) kept its identity, and a shared cache served the old
    code's samples."""
    parts: list[str] = []
    for k in cls.__mro__:
        mod = module_name(k)
        if mod.partition(".")[0] in _LIBRARIES:
            version = package_version(mod)
            if version and f"{mod}={version}" not in parts:
                parts.append(f"{mod}={version}")
            continue
        fns = []
        for name, v in k.__dict__.items():
            v = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
            accessors = (v.fget, v.fset, v.fdel) if isinstance(v, property) else (v,)
            for f in accessors:
                if inspect.isfunction(f):
                    fns.append(f)
                    defaults = (f.__defaults__, f.__kwdefaults__)
                    parts.append(f"{k.__qualname__}.{name}={_code_digest(f.__code__)}" + (
                        f":{state_digest(defaults, depth + 1)}" if defaults != (None, None)
                        else ""))
        if depth == 0 and fns:  # the code they call, not the data they read (a memo table)
            parts.append(_globals_digest(fns[0].__globals__, [f.__code__ for f in fns], mod,
                                         values=False))
    return short_hash(";".join(parts).encode())


def _globals_digest(g: Any, codes: list[Any], own: str, values: bool = True) -> str:
    """The module globals that ``codes`` (a step's function, or the methods of a step's
    class, defined in module ``own``) read (``co_names`` found in ``g``, their
    ``__globals__``, nested code included), by value: a setting from the command line
    (``SIZE``), a table; of an object (``args``), only the attributes the code names
    (``args.size``, not ``args.lr`` or ``args.resume``, which differ between jobs sharing a
    cache and between a run and its resume); functions it calls by their code (not further),
    classes by name (one of ``own`` by its methods' code). A module by its content
    (:func:`modules.module_digest`), with the submodules the code names (``pkg.sub.fn``), and
    a function or class imported from another module with that module's: ``mylib.decode``
    edited in ``mylib.py`` kept the step's identity. Only for the step's own function: deeper
    callables count their code. ``values=False``: other globals by name only."""
    if not isinstance(g, dict):
        return "-"
    used: set[str] = set()
    stack = list(codes)
    while stack:
        c = stack.pop()
        used.update(c.co_names)
        stack.extend(k for k in c.co_consts if inspect.iscode(k))
    parts = []
    for n in sorted(n for n in used if n in g)[:MAX_ITEMS]:
        v = g[n]
        if inspect.ismodule(v):
            parts.append(f"{n}={_modules_digest(v, used)}")
        elif inspect.isclass(v):
            own_class = module_name(v) == own
            parts.append(f"{n}={qualified_name(v)}:"
                         f"{_methods_digest(v, 1) if own_class else _module_of(v, own)}")
        elif getattr(v, "__code__", None) is not None:
            parts.append(f"{n}={_code_digest(v.__code__)}:{_module_of(v, own)}")
        elif not values:
            parts.append(n)
        elif isinstance(getattr(v, "__dict__", None), dict) and not callable(v):
            attrs = {a: x for a, x in vars(v).items() if a in used}
            parts.append(f"{n}={qualified_name(type(v))}:{state_digest(attrs, 1)}")
        else:
            parts.append(f"{n}={state_digest(v, 1)}")
    return short_hash(";".join(parts).encode())


def _modules_digest(mod: Any, used: set[str]) -> str:
    """:func:`modules.module_digest` of ``mod`` and of the submodules reached from it through
    names in ``used`` (``torch.nn.functional``: ``torch``, ``torch.nn``, its ``functional``),
    read from the modules' ``__dict__`` (a module's ``__getattr__`` may import), and of the
    modules defining the functions and classes reached so: a package re-exporting
    ``from mylib.impl import decode`` kept its identity when ``impl.py`` was edited. Those of
    ``_LIBRARIES`` count by their package's digest alone."""
    found = [mod]
    for m in found:  # grows: at most one module a name
        for a in sorted(used):
            sub = getattr(m, "__dict__", {}).get(a)
            home: Any
            if inspect.ismodule(sub):
                home = sub
            elif inspect.isfunction(sub) or inspect.isclass(sub):
                home = sys.modules.get(module_name(sub))
            else:
                continue
            if (home is not None and all(home is not f for f in found)
                    and not (home is not sub and module_name(home).partition(".")[0]
                             in _LIBRARIES)):
                found.append(home)
    return ",".join(module_digest(m) for m in found)


def _module_of(obj: Any, own: str) -> str:
    """:func:`modules.module_digest` of the module ``obj`` was defined in, unless that is
    ``own`` (its code counts on its own) or not imported; else ``-``."""
    name = module_name(obj)
    mod = sys.modules.get(name) if name != own else None
    return module_digest(mod) if mod is not None else "-"
