"""Stable fingerprints of steps, sources and pipelines: same code and order -> same hex string.

Stable across processes: a class defined in the training script is ``__main__.X`` in the
process that runs it and ``__mp_main__.X`` in a ``spawn`` child, and both name it ``__main__``
here; object state is hashed by value (arrays by their bytes, nested objects by their own
state), never through a ``repr`` that may hold a memory address. Fingerprints decide which stored
profile a run reuses and which steps a resume reports as changed; they never refuse a resume
(``runtime/checkpoint.py`` decides that from lengths and batch layout).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
from typing import TYPE_CHECKING, Any

from headrace.pipeline.modules import module_digest, package_version
from headrace.pipeline.source import DatasetSource, user_attr

if TYPE_CHECKING:
    from headrace.pipeline.pipeline import Pipeline

_MAX_DEPTH = 6
"""Nesting levels of object state hashed; deeper state counts by its type only (numbers,
strings and arrays count by value at any depth). An object and its state take a level each, so
a ``Compose([Resize(224)])`` step reaches the 224 at level 5: object, state, list, transform,
state, value."""
_MAX_ITEMS = 64
"""Elements of a list, tuple, set or dict hashed; longer ones count by length beyond that."""
_FULL_BYTES = 1 << 20
"""Arrays and tensors of up to this many bytes are hashed whole; larger ones by dtype, shape and
``_SAMPLED`` evenly spaced elements. Fingerprints are taken at every epoch's start and in every
``state_dict()``, and a step that is a bound method counts the object it is bound to: hashing a
CIFAR-10 held in memory there (150 MB) took 0.5 s a call; a change to a large array that none
of the sampled elements sees is not told apart."""
_SOURCE_DEPTH = -4
"""The depth a source's state is hashed from (:func:`source_fingerprint` with ``content``):
four levels more than a step's, for two wrappers (an object and its state a level each) such as
a ``Subset`` around a dataset holding a ``Compose([Resize(224)])``, whose 224 a step's depth
did not reach: two jobs over ``Resize(224)`` and ``Resize(256)`` shared a cache."""
_SAMPLED = 1 << 16
"""Elements hashed of an array or tensor over ``_FULL_BYTES`` (first and last included)."""
_LIBRARIES = frozenset({"torch", "numpy"}) | frozenset(sys.stdlib_module_names)
"""Top-level packages whose classes count by the package's version, not by their methods'
code (:func:`_methods_digest`): a transform subclassing ``nn.Module`` would otherwise hash its
hundreds of methods at every fingerprint."""


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
    """Bytecode, the names it uses (``co_names``: globals and attributes, so ``x.mean()`` and
    ``x.max()`` differ) and its constants, nested code objects included."""
    parts = [code.co_code, ",".join(code.co_names).encode()]
    for c in code.co_consts:
        parts.append(_code_digest(c).encode() if inspect.iscode(c) else repr(c).encode())
    return _h(b"\x00".join(parts))


def state_digest(value: Any, depth: int = 0) -> str:
    """A digest of ``value`` by content: numbers, strings and bytes by value, arrays and
    tensors by dtype, shape and bytes (a sample of the elements over ``_FULL_BYTES``),
    containers element by element, callables by
    :func:`code_identity`, other objects by class and ``__dict__``."""
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, complex, str)):
        return _h(repr(value).encode())
    if isinstance(value, (bytes, bytearray, memoryview)):
        if len(value) <= _FULL_BYTES or isinstance(value, memoryview) and not value.contiguous:
            return _h(bytes(value))
        return _h(_array_bytes(np.frombuffer(value, np.uint8)))  # a sample, as a large array's
    if isinstance(value, np.ndarray) and value.dtype.hasobject:  # elements, not pointers
        return _h(f"object{value.shape}:{state_digest(value.ravel()[:_MAX_ITEMS].tolist(), depth)}"
                  .encode())
    if isinstance(value, np.ndarray):
        return _h(f"{value.dtype}{value.shape}".encode() + _array_bytes(value))
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return _h(f"{value.dtype}{tuple(value.shape)}".encode() + _tensor_bytes(value))
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
    if callable(value):  # its state one level down, as any object's
        return _h(code_identity(value, depth).encode())
    state = getattr(value, "__dict__", None)
    name = qualified_name(type(value))
    if isinstance(state, dict):
        return _h(f"{name}:{state_digest(state, depth + 1)}".encode())
    rest = _dictless_state(value, depth + 1)
    return _h(f"{name}:{rest}".encode() if rest is not None else name.encode())


def _array_bytes(a: Any) -> bytes:
    """The bytes of NumPy array ``a`` a digest hashes: all of them up to ``_FULL_BYTES``, else
    ``_SAMPLED`` evenly spaced elements (read in place, whatever the strides)."""
    import numpy as np

    if a.nbytes <= _FULL_BYTES:
        return np.ascontiguousarray(a).tobytes()
    picks = np.linspace(0, a.size - 1, _SAMPLED, dtype=np.int64)
    return b"sampled:" + a.flat[picks].tobytes()


def _tensor_bytes(t: Any) -> bytes:
    """:func:`_array_bytes` of a tensor: a CPU tensor through a NumPy view of its memory (dtypes
    NumPy lacks, such as bfloat16, as same-size integers), another device's sampled there and
    only the sample copied to the CPU."""
    import numpy as np
    import torch

    t = t.detach()
    if t.device.type == "meta":
        return b"meta"  # no values
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        return b"coo:" + _tensor_bytes(t.indices()) + b":" + _tensor_bytes(t.values())
    if t.layout != torch.strided:  # other sparse layouts: by their dense values
        t = t.to_dense()
    t = t.resolve_conj().resolve_neg()
    if t.device.type != "cpu":
        if t.numel() * t.element_size() > _FULL_BYTES:
            picks = torch.linspace(0, t.numel() - 1, _SAMPLED, device=t.device).long()
            return b"sampled:" + _tensor_bytes(t.reshape(-1)[picks].cpu())
        t = t.cpu()
    try:
        a = t.numpy()
    except TypeError:  # no NumPy dtype: its bits
        a = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
                   [t.element_size()]).numpy()
    return _array_bytes(a) if isinstance(a, np.ndarray) else b""


def _dictless_state(value: Any, depth: int) -> str | None:
    """A digest of the state of an object without a ``__dict__``, hashed at ``depth`` as a
    ``__dict__`` would be: its ``__slots__``' values, else what pickle rebuilds it from
    (``__reduce_ex__``: a name for ``torch.float16``, constructor arguments for a
    ``pathlib.Path``, ``datetime.date``, NumPy scalar, ``torch.device`` or
    ``operator.itemgetter``). ``None`` when neither can be read: the object then counts by its
    type only."""
    slots: dict[str, Any] = {}
    for cls in type(value).__mro__:
        names = cls.__dict__.get("__slots__", ())
        for n in (names,) if isinstance(names, str) else names:
            if n.startswith("__") and not n.endswith("__"):  # a private name, mangled
                n = f"_{cls.__name__.lstrip('_')}{n}"
            if n not in ("__dict__", "__weakref__") and n not in slots and hasattr(value, n):
                slots[n] = getattr(value, n)
    if slots:
        return state_digest(slots, depth)
    try:
        reduced = value.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 - not picklable: nothing to read its state from
        return None
    if isinstance(reduced, str):  # a module-level object, pickled by its name
        return _h(reduced.encode())
    if isinstance(reduced, tuple) and len(reduced) >= 2:
        args = state_digest(reduced[1], depth)
        extra = state_digest(reduced[2], depth) if len(reduced) > 2 else "-"
        return _h(f"{args}:{extra}".encode())
    return None


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
        if state and depth < _MAX_DEPTH:
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
        if cells and depth < _MAX_DEPTH:
            captured = []
            for c in cells:
                try:
                    captured.append(state_digest(c.cell_contents, depth + 1))
                except ValueError:  # an empty cell
                    captured.append("-")
            ident += ":" + _h(",".join(captured).encode())
        return ident
    cls = type(fn)
    ident = f"{qualified_name(cls)}:{_methods_digest(cls, depth)}"
    if depth >= _MAX_DEPTH:
        return ident
    state = getattr(fn, "__dict__", None)
    rest = (state_digest(state, depth + 1) if state else None) if isinstance(state, dict) \
        else _dictless_state(fn, depth + 1)
    return ident + (f":{rest}" if rest is not None else "")


def _methods_digest(cls: type, depth: int) -> str:
    """The code of the functions ``cls`` and its bases define (methods, static and class
    methods, properties' accessors), each with its default arguments; bases from
    ``_LIBRARIES`` (``nn.Module``, ``object``) count by their package's version instead. At
    ``depth`` 0 (the step itself), also the modules, functions and classes these functions
    reference, as a step function's, but not other globals' values: a method filling a
    module-level memo table changed the step's identity as it ran (the cache stopped hitting,
    a resume said the step changed). A callable class counted its ``__call__`` only: an edited helper method it
    calls (``self._go``) kept its identity, and a shared cache served the old code's samples."""
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
    return _h(";".join(parts).encode())


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
    for n in sorted(n for n in used if n in g)[:_MAX_ITEMS]:
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
    return _h(";".join(parts).encode())


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


def source_fingerprint(source: Any, content: bool = False) -> str:
    """The source's own ``fingerprint()`` if it has one, else its type and length; with
    ``content``, also its state by value (:func:`state_digest` of its attributes: the paths it
    reads, its arrays by a sample, its transforms' code and parameters). A map-style dataset
    wrapped as a source (``DatasetSource``) counts as the dataset.

    Without ``content`` (a state dict's record of the dataset, the profile store), two datasets
    of one class and length match. The sample cache keys its entries ``content``: a cache shared
    through Redis otherwise served a job over ``Images("/data/a")`` the samples of a job over
    ``Images("/data/b")`` of the same length. The cache takes it at every epoch's plan
    (``cache/session.py``): a source the script changes between epochs gets other entries."""
    if content and isinstance(source, DatasetSource):
        return f"{source_fingerprint(source.dataset, content)}:{bool(source._many)}"
    fp = user_attr(source, "fingerprint")
    if callable(fp):
        return str(fp())
    try:
        n: int | str = len(source)
    except Exception:  # noqa: BLE001 - no __len__, or one that raises (Pipeline.length)
        n = "?"
    name = f"{qualified_name(type(source))}:{n}"
    return f"{name}:{state_digest(source, _SOURCE_DEPTH)}" if content else name
