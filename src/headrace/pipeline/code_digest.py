"""The identity of a step's code, the same in every process: a function by its bytecode, the
names it uses, its constants, defaults, captured values, the module globals it reads and the
helpers of its module it calls (with the settings they read, not the tables they fill); a
callable object by its class's methods and its state; a module it calls into by its source
(:mod:`modules`).

The state of the objects reached (bound arguments, captured values, an object's attributes)
counts by :func:`value_digest.state_digest`, which counts a callable inside a value by
:func:`code_identity` again: this module imports ``value_digest`` at its top, ``value_digest``
this one inside ``state_digest`` (a local import).
"""

from __future__ import annotations

import dis
import functools
import inspect
import sys
from types import FunctionType
from typing import Any

from headrace.pipeline.digest_scope import (
    CODE_ONLY,
    MAX_NESTING,
    digest_scope,
    generator_kind,
    guarded,
    module_name,
    note_generator,
    on_path,
    qualified_name,
    running,
    short_hash,
)
from headrace.pipeline.modules import module_digest, package_version
from headrace.pipeline.value_digest import (
    FULL_ITEMS,
    SCALAR_TYPES,
    dictless_state,
    state_digest,
)

_LIBRARIES = frozenset({"torch", "numpy"}) | frozenset(sys.stdlib_module_names)
"""Top-level packages whose classes count by the package's version, not by their methods'
code (:func:`_methods_digest`): a transform subclassing ``nn.Module`` would otherwise hash its
hundreds of methods at every fingerprint."""
MAX_HELPERS = 64
"""Functions of a step's module followed from its code (:func:`_helpers`): a bound on code
followed, not on values hashed."""


@functools.lru_cache(maxsize=4096)
def _code_digest(code: Any) -> str:
    """Bytecode, the names it uses (``co_names``: globals and attributes, so ``x.mean()`` and
    ``x.max()`` differ) and its constants (:func:`_const_repr`), nested code objects
    included. Kept per code object (equal code: equal bytecode, names and constants), as
    fingerprints are taken at every epoch and ``state_dict()``: a dataset class of 300
    methods took 0.8 ms to hash each time."""
    parts = [code.co_code, ",".join(code.co_names).encode()]
    for c in code.co_consts:
        parts.append(_code_digest(c).encode() if inspect.iscode(c) else _const_repr(c).encode())
    return short_hash(b"\x00".join(parts))


def _const_repr(c: Any) -> str:
    """``repr`` of a code constant, a frozenset's elements sorted (inside tuples too; other
    constants as ``repr`` writes them, so other code keeps its identity): the
    constant of ``x in {"a", "b"}`` iterates in an order that string hashing, seeded anew in
    each process, decides, so the same code had another identity in every process (a resume
    said the dataset or step changed, a Redis cache shared across jobs never hit)."""
    if type(c) is frozenset and c:
        return "frozenset({" + ", ".join(sorted(_const_repr(x) for x in c)) + "})"
    if type(c) is tuple:  # as its repr: "(1,)", "(1, 2)"
        return "(" + ", ".join(_const_repr(x) for x in c) + ("," if len(c) == 1 else "") + ")"
    return repr(c)


def code_identity(fn: Any, depth: int = 0) -> str:
    """Identity of a callable's code: qualified name plus bytecode and constants when available.

    Callable objects are identified by their class, the code of every method it and its bases
    define (:func:`_methods_digest`: the helper methods its ``__call__`` calls too) and their
    state by value (``__dict__``, else ``__slots__`` or what pickle rebuilds them from), so two
    ``Resize(224)`` instances match and ``Resize(256)`` does not. Closures count the values
    they captured; a step's function, the helpers of its module it calls and the globals they
    read (:func:`_globals_digest`). A ``functools.partial`` is its function's identity plus
    its bound arguments and keywords by value (nested partials likewise), and a bound method
    is its function, its class's methods and the object it is bound to, so
    ``partial(scale, factor=2)`` and ``partial(scale, factor=3)``, or ``Scaler(2).apply`` and
    ``Scaler(3).apply``, differ. A built-in function is its qualified name (``builtins.abs``,
    ``torch._VariableFunctionsClass.flatten``) plus the object it is bound to, if any; a class
    is its qualified name and its methods' code.

    State counts at any depth (``value_digest``'s module docstring); ``depth`` 0 is the step
    itself (the globals it reads count), ``digest_scope.CODE_ONLY`` the code without its
    parameters. Called outside a whole digest, it is one (``digest_scope.digest_scope``).
    """
    if not running():
        with digest_scope():
            return guarded(code_identity, fn, depth)
    return on_path(fn, _identity, depth)  # a cycle through its state ends here


def _identity(fn: Any, depth: int) -> str:
    """:func:`code_identity` of ``fn``, on the running digest's path. The step itself
    (``depth`` 0) wrapped by a decorator (``functools.wraps``: ``@torch.no_grad()``,
    ``@functools.lru_cache``) counts the function it wraps as a step too, with the globals
    that one reads: they counted as a captured function's, without its globals, and a step
    ``@torch.no_grad() def features(x): return enc(x)`` was served the features of the
    weights ``enc`` had before the script loaded others (a bug hunt)."""
    inner = getattr(fn, "__wrapped__", None) if depth == 0 else None
    if callable(inner) and inner is not fn:
        return f"{_unwrapped_identity(fn, depth)}:wraps:{code_identity(inner, 0)}"
    return _unwrapped_identity(fn, depth)


def _unwrapped_identity(fn: Any, depth: int) -> str:
    """:func:`_identity` without the function a decorator wraps."""
    if isinstance(fn, functools.partial):
        ident = (f"{qualified_name(type(fn))}({code_identity(fn.func, depth)}"
                 f";{state_digest(fn.args, depth + 1)};{state_digest(fn.keywords, depth + 1)})")
        state = getattr(fn, "__dict__", None)
        if state and depth < CODE_ONLY:
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
        if depth == 0:  # the step's own function: the globals it reads, by value; its helpers
            ident += ":" + _globals_digest(getattr(fn, "__globals__", None), [code],
                                           module_name(fn))
        cells = getattr(fn, "__closure__", None) or ()
        if cells and depth < CODE_ONLY:
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
    if depth >= CODE_ONLY:
        return ident
    state = getattr(fn, "__dict__", None)
    rest = (state_digest(state, depth + 1) if state else None) if isinstance(state, dict) \
        else dictless_state(fn, depth + 1)
    return ident + (f":{rest}" if rest is not None else "")


def _methods_digest(cls: type, depth: int) -> str:
    """The code of the functions ``cls`` and its bases define (methods, static and class
    methods, properties' accessors), each with its default arguments; bases from
    ``_LIBRARIES`` (``nn.Module``, ``object``) count by their package's version instead. At
    ``depth`` 0 (the step itself), also the globals these functions read and the helpers of
    their module they call, as a step function's, but only immutable scalars by value
    (:func:`_global_part`): a method filling a module-level memo table changed the step's
    identity as it ran (the cache stopped hitting, a resume said the step changed). A callable
    class counted its ``__call__`` only: an edited helper method it calls (``self._go``) kept
    its identity, and a shared cache served the old code's samples."""
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
        if depth == 0 and fns:  # the code they call, settings they read, not a memo table
            parts.append(_globals_digest(fns[0].__globals__, [f.__code__ for f in fns], mod,
                                         values=False))
    return short_hash(";".join(parts).encode())


def _globals_digest(g: Any, codes: list[Any], own: str, values: bool = True) -> str:
    """The module globals that ``codes`` (a step's function, or the methods of a step's
    class, defined in module ``own``) read (``co_names`` found in ``g``, their
    ``__globals__``, nested code included): with ``values``, by value: a setting from the
    command line (``SIZE``), a table; of an object (``args``), only the attributes the code
    names (``args.size``, not ``args.lr`` or ``args.resume``, which differ between jobs sharing
    a cache and between a run and its resume). Without (a class's methods), by
    :func:`_global_part`'s rule: immutable scalars by value, other objects by name. Functions
    by their code, classes by name (one of ``own`` by its methods' code). A module by its
    content (:func:`modules.module_digest`), with the submodules the code names
    (``pkg.sub.fn``), and a function or class imported from another module with that module's:
    ``mylib.decode`` edited in ``mylib.py`` kept the step's identity.

    Then the helpers: the functions of ``own`` (those whose ``__globals__`` is ``g``) that
    ``codes`` name, the ones those name, and so on (:func:`_helpers`), and the globals they
    read, by :func:`_global_part`'s rule. A step calling ``helper(x)`` that reads ``SCALE``
    counted ``helper``'s code only: a curriculum changing ``SCALE`` between epochs was served
    the first epoch's samples by the default cache (a bug hunt). Every global named counts
    (before ``identity_version`` 5, the first 64 in sorted order: one past them was not seen)."""
    if not isinstance(g, dict):
        return "-"
    used = _names(codes)
    helpers = _helpers(g, used)
    stored = _stores(codes + helpers) if helpers or not values else frozenset()
    parts = [_global_part(g, n, used, own, values, stored)
             for n in sorted(n for n in used if n in g)]
    if helpers:
        read = _names(helpers)
        parts.append("helpers")
        parts += [_global_part(g, n, read, own, False, stored)
                  for n in sorted(n for n in read - used if n in g)]
    return short_hash(";".join(parts).encode())


def _global_part(g: dict[str, Any], n: str, used: set[str], own: str, values: bool,
                 stored: frozenset[str]) -> str:
    """How global ``n`` counts in :func:`_globals_digest` (``used``: the names the code reads).
    Without ``values``: an immutable scalar (``None``, a number, a string, bytes, a tuple or
    frozenset of those) by value, unless the code followed assigns it (``stored``: ``global
    n`` then ``n = ...``, a counter or a table built on first use); other objects (a dict, a
    list, an object) by name. A module-level memo table a method or helper fills is such an
    object: by value it changed the step's identity as the step ran (the cache stopped
    hitting, a resume said the step changed). A setting the script changes between epochs (a
    curriculum's ``SCALE``) is a scalar: by name the cache served the old setting's samples.
    A random generator (``RNG = np.random.default_rng(0)``) counts by its type and is recorded
    (``digest_scope.Findings``): the code may draw from it."""
    v = g[n]
    kind = generator_kind(v)
    if kind is not None:  # a module-level generator the code may draw from: by its type
        note_generator(kind)
        return f"{n}=generator:{kind}"
    if inspect.ismodule(v):
        return f"{n}={_modules_digest(v, used)}"
    if inspect.isclass(v):
        own_class = module_name(v) == own
        return (f"{n}={qualified_name(v)}:"
                f"{_methods_digest(v, 1) if own_class else _module_of(v, own)}")
    if getattr(v, "__code__", None) is not None:
        return f"{n}={_code_digest(v.__code__)}:{_module_of(v, own)}"
    if not values:
        return f"{n}={state_digest(v, 1)}" if n not in stored and _immutable(v, 0) else n
    if isinstance(getattr(v, "__dict__", None), dict) and not callable(v):
        attrs = {a: x for a, x in vars(v).items() if a in used}
        return f"{n}={qualified_name(type(v))}:{state_digest(attrs, 1)}"
    return f"{n}={state_digest(v, 1)}"


def _immutable(v: Any, depth: int) -> bool:
    """Whether ``v`` is an immutable scalar (``None``, ``bool``, ``int``, ``float``,
    ``complex``, ``str``, ``bytes``) or a tuple or frozenset of such values, nested at most
    ``MAX_NESTING`` deep: of any length when its items are scalars, of at most ``FULL_ITEMS``
    otherwise (64 before ``identity_version`` 5: a helper reading a 100-entry tuple counted it by
    name)."""
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return True
    if type(v) not in (tuple, frozenset) or depth >= MAX_NESTING:
        return False
    return set(map(type, v)) <= SCALAR_TYPES or (
        len(v) <= FULL_ITEMS and all(_immutable(x, depth + 1) for x in v))


def _helpers(g: dict[str, Any], names: set[str]) -> list[Any]:
    """The code of the functions of ``g``'s module (their ``__globals__`` is ``g``) reached
    from ``names``: those named, the ones their code names, and so on, each once (a helper
    calling itself, or two calling each other, end there), at most ``MAX_HELPERS`` functions."""
    found: list[Any] = []
    seen: set[str] = set()
    todo = sorted(names & g.keys())  # most names are attributes (x.mean), not globals
    while todo and len(found) < MAX_HELPERS:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        v = g[n]
        if isinstance(v, FunctionType) and v.__globals__ is g:
            found.append(v.__code__)
            todo.extend(sorted(_code_facts(v.__code__)[0] & g.keys() - seen))
    return found


def _names(codes: list[Any]) -> set[str]:
    """The names (``co_names``) ``codes`` use, nested code included."""
    out: set[str] = set()
    for c in codes:
        out |= _code_facts(c)[0]
    return out


def _stores(codes: list[Any]) -> frozenset[str]:
    """The globals ``codes`` assign or delete (``global n`` then ``n = ...``)."""
    return frozenset().union(*(_code_facts(c)[1] for c in codes))


_GLOBAL_WRITES = frozenset({dis.opmap["STORE_GLOBAL"], dis.opmap["DELETE_GLOBAL"]})
"""The opcodes assigning and deleting a global (``global n`` then ``n = ...``, ``del n``)."""


@functools.lru_cache(maxsize=4096)
def _code_facts(code: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(names used, globals assigned or deleted) of ``code`` and the code nested in it; kept
    per code object (equal code, equal facts) as fingerprints are taken at every epoch."""
    names: set[str] = set()
    stores: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        if not _GLOBAL_WRITES.isdisjoint(c.co_code[::2]):  # opcodes: a word's first byte
            stores.update(i.argval for i in dis.get_instructions(c)
                          if i.opcode in _GLOBAL_WRITES)
        stack.extend(k for k in c.co_consts if inspect.iscode(k))
    return frozenset(names), frozenset(stores)


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
